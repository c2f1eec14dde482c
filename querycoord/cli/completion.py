"""``querycoord completion bash|zsh``: a completion script for every command and option, made by shtab.

Made from the parser itself, so it cannot drift from the commands:
``source <(querycoord completion bash)`` in a bash session (or
``querycoord completion bash > /etc/bash_completion.d/querycoord``);
``querycoord completion zsh > "${fpath[1]}/_querycoord"`` for zsh.
"""

from __future__ import annotations

import argparse
from typing import Any

SHELLS = ("bash", "zsh")


def add_parsers(sub: Any, root: argparse.ArgumentParser) -> None:
    p = sub.add_parser("completion", help="print a shell completion script: source <(querycoord completion bash)")
    p.add_argument("shell", choices=SHELLS, help="bash or zsh")
    p.set_defaults(func=lambda args: _print_script(root, args.shell))


def _print_script(root: argparse.ArgumentParser, shell: str) -> int:
    import shtab

    print(shtab.complete(root, shell=shell))
    return 0
