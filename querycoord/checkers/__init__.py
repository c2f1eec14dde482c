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
"""

from querycoord.checkers.diff import diff, diff_async
from querycoord.checkers.distribution import TURN_SEGMENTS, Held, Holders
from querycoord.checkers.driver import Checker, CheckReport
from querycoord.checkers.scan import Diff, describe

__all__ = ["TURN_SEGMENTS", "CheckReport", "Checker", "Diff", "Held", "Holders", "describe", "diff", "diff_async"]
