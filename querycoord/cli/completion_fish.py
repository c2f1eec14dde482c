"""The fish completion script of ``querycoord``, made from the parser (shtab knows bash, zsh and tcsh, not fish).

Walks the argparse tree as shtab does for the other shells, so it cannot drift from the commands: each
sub-command is offered where it is valid (``querycoord collection <TAB>`` offers create, load, ...), each
option once its command is on the line, with its help as the description; an option with choices offers them,
an option with a value takes any argument (files included), a flag takes none. A command group's words are
tested with ``__fish_seen_subcommand_from`` along the whole path, so ``show`` of ``collection`` and ``show`` of
``stream`` keep their own options.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

PROG = "querycoord"


def _quote(text: str) -> str:
    """``text`` as one fish single-quoted word."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _describe(help_: str | None) -> str:
    """An option's help without its defaults and variables, short enough for fish's pager."""
    text = " ".join((help_ or "").replace("%%", "%").split())
    for stop in (" (default", " ($"):
        if stop in text:
            text = text[: text.index(stop)]
    return text if len(text) <= 70 else text[:69] + "…"


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in parser._actions:  # noqa: SLF001 - argparse lists actions only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001 - argparse's sub-command action class
            return action
    return None


def _condition(path: list[str], children: list[str]) -> str:
    """fish test that the words of ``path`` are on the line (and, for offering ``children``, none of them yet)."""
    if not path:
        return "__fish_use_subcommand"
    parts = [f"__fish_seen_subcommand_from {word}" for word in path]
    if children:
        parts.append("not __fish_seen_subcommand_from " + " ".join(children))
    return "; and ".join(parts)


def _lines(parser: argparse.ArgumentParser, path: list[str]) -> Iterator[str]:
    sub = _subparsers(parser)
    children: dict[str, argparse.ArgumentParser] = dict(sub.choices) if sub is not None else {}
    helps = {a.dest: a.help for a in sub._choices_actions} if sub is not None else {}  # noqa: SLF001
    head = f"complete -c {PROG}"
    options_when = f" -n {_quote(_condition(path, []))}" if path else ""
    for action in parser._actions:  # noqa: SLF001
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            continue
        flags = list(action.option_strings)
        if not flags:  # a positional: offer its choices, if it has any
            if action.choices:
                words = " ".join(str(c) for c in action.choices)
                yield f"{head} -n {_quote(_condition(path, []))} -f -a {_quote(words)}"
            continue
        spec = "".join(f" -l {f[2:]}" if f.startswith("--") else f" -s {f[1:]}" for f in flags)
        if action.nargs == 0:
            takes = ""
        elif action.choices:
            takes = " -x -a " + _quote(" ".join(str(c) for c in action.choices))
        else:
            takes = " -r"
        yield f"{head}{options_when}{spec}{takes} -d {_quote(_describe(action.help))}"
    for name, child in children.items():
        if name not in helps:  # an alias
            continue
        yield (f"{head} -n {_quote(_condition(path, list(children)))} -f -a {name} "
               f"-d {_quote(_describe(helps[name]))}")
        yield from _lines(child, [*path, name])


def fish_script(root: argparse.ArgumentParser) -> str:
    """The whole script: ``querycoord completion fish > ~/.config/fish/completions/querycoord.fish``."""
    lines = [f"# fish completion for {PROG}, made from its parser: {PROG} completion fish",
             f"complete -c {PROG} -e"]
    lines += _lines(root, [])
    return "\n".join(lines)
