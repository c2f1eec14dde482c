"""``querycoord completion bash|zsh|fish``: a completion script for every command and option.

Made from the parser itself, so it cannot drift from the commands:
``source <(querycoord completion bash)`` in a bash session (or
``querycoord completion bash > /etc/bash_completion.d/querycoord``);
``querycoord completion zsh > "${fpath[1]}/_querycoord"`` for zsh;
``querycoord completion fish > ~/.config/fish/completions/querycoord.fish`` for fish. shtab writes bash's and
zsh's; fish's is ours (``cli/completion_fish.py``), shtab has none.
"""

from __future__ import annotations

import argparse
from typing import Any

from querycoord.cli.completion_fish import fish_script

SHELLS = ("bash", "zsh", "fish")


def add_parsers(sub: Any, root: argparse.ArgumentParser) -> None:
    p = sub.add_parser("completion", help="print a shell completion script: source <(querycoord completion bash)")
    p.add_argument("shell", choices=SHELLS, help="bash, zsh or fish")
    p.set_defaults(func=lambda args: _print_script(root, args.shell))


def _print_script(root: argparse.ArgumentParser, shell: str) -> int:
    if shell == "fish":
        print(fish_script(root))
        return 0
    import shtab

    print(shtab.complete(root, shell=shell))
    return 0
