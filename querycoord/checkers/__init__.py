"""The checkers: level-triggered reconciliation under the task trees (DESIGN rule 6).

Triggers are edge-triggered: each does what it was asked and ends. Whatever falls between them (a balance that
gave up, a node that lost a segment, a segment sealed while no leader watched the catalog, a rollback cut short)
would stay wrong until someone asks again. The checker closes that gap the way Milvus's querycoordv2 does: it
compares the **target** (``targets``: what should be held, from query meta and the catalog) with the
**distribution** (``distribution``: what every online node reports) and repairs each difference through the
scheduler. Load percentages are derived from what nodes hold (``progress``).

One module per check kind: ``segments``, ``channels``, ``replicas`` (members, offline nodes), ``releases``
(stale copies and records), ``parked`` (units that cannot be placed now); ``diff`` runs the comparison's
steps over a ``scan.Scan``, ``driver`` runs the passes (``Checker``).

The names below are imported when first used (PEP 562): a light module of the package (``activation``,
``left``: what ``querycoord status`` and ``meta verify`` read) is imported without the checker itself.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from querycoord.checkers.diff import diff, diff_async
    from querycoord.checkers.distribution import TURN_SEGMENTS, Held, Holders
    from querycoord.checkers.driver import Checker, CheckReport
    from querycoord.checkers.scan import Diff, describe

# name -> the module of the package that defines it
_HOME = {"diff": "diff", "diff_async": "diff", "TURN_SEGMENTS": "distribution", "Held": "distribution",
         "Holders": "distribution", "Checker": "driver", "CheckReport": "driver", "Diff": "scan", "describe": "scan"}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


__all__ = ["TURN_SEGMENTS", "CheckReport", "Checker", "Diff", "Held", "Holders", "describe", "diff", "diff_async"]
