"""``python -m querycoord.drill``: the drills without the rest of the CLI."""

import sys

from querycoord.drill import main

sys.exit(main())
