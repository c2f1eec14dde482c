"""``python -m querycoord.cli``: the same as the ``querycoord`` command."""

import sys

from querycoord.cli import main

sys.exit(main())
