"""A node process loads none of the coordinator's side: its engine, meta, surfaces or client-side commands.

Why it matters: a node imports what it runs; every coordinator module it loads
is start-up time, memory and attack surface it does not use, and an arrow
pointing up the layers that the next change can turn into a cycle.
"""

from __future__ import annotations

import json
import subprocess
import sys

COORDINATOR_SIDE = ("querycoord.task", "querycoord.checkers", "querycoord.console", "querycoord.leader",
                    "querycoord.serving", "querycoord.served", "querycoord.querymeta", "querycoord.stream",
                    "querycoord.catalog", "querycoord.cli")


def test_node_modules_load_nothing_of_the_coordinator() -> None:
    code = ("import json, sys\n"
            "import querycoord.nodes.node_process, querycoord.nodes.querynode, querycoord.nodes.streamnode\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('querycoord'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "querycoord.nodes.node_process" in loaded
    coordinator_side = [m for m in loaded if any(m == p or m.startswith(p + ".") for p in COORDINATOR_SIDE)]
    assert coordinator_side == [], f"a node process loads coordinator modules: {coordinator_side}"
