"""loguru's logger, imported when something first logs rather than when a module that may log is imported.

A short process that logs nothing (``querycoord status`` reading a few keys)
never pays for loguru's import, a tenth of such a run. ``logger`` here stands
for ``loguru.logger``: every attribute is loguru's own, looked up at the call
(the caller's frame is loguru's as before, so records name the module that
logged). ``when_loguru_loaded(fn)`` runs ``fn(loguru.logger)`` at once when
loguru is loaded, else right after whoever first imports it, before that
importer's next statement: ``meta`` disables its own logs so (a library is
silent until the application enables them) and an application that enables
them, even with ``from loguru import logger`` before anything of ``meta``
logged, finds them disabled first and enabled after, as when ``meta``
imported loguru itself.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    from loguru import Logger

_PENDING: list[Callable[[Logger], None]] = []


class _Lazy:
    """``loguru.logger``, imported at the first attribute asked of it."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        from loguru import logger as real

        return getattr(real, name)


logger = cast("Logger", _Lazy())


class _AfterImport:
    """A finder that finds nothing of its own: it hands the import system loguru's spec with a loader that runs
    the pending calls once loguru's module is executed."""

    done = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name != "loguru" or self.done:
            return None
        self.done = True  # from here the finder is inert (removing it while the import system iterates is not safe)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _run_pending(module.logger)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's own loader instance
        return spec


_HOOK: _AfterImport | None = None


def _run_pending(real: Logger) -> None:
    while _PENDING:
        _PENDING.pop(0)(real)


def when_loguru_loaded(fn: Callable[[Logger], None]) -> None:
    """``fn(loguru.logger)`` now if loguru is loaded, else right after it is imported (in the order asked)."""
    global _HOOK
    loaded = sys.modules.get("loguru")
    if loaded is not None and hasattr(loaded, "logger"):
        _run_pending(loaded.logger)
        fn(loaded.logger)
        return
    _PENDING.append(fn)
    if _HOOK is None:
        _HOOK = _AfterImport()
        sys.meta_path.insert(0, _HOOK)


__all__ = ["logger", "when_loguru_loaded"]
