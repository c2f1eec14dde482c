"""``python -m querycoord.tooling.drill``: the drills without the rest of the CLI."""

import sys

from querycoord.tooling.drill import main

sys.exit(main())
