"""The fault hook: ``hook(point, ctx)``, called at named points of a protocol.

The store (``StoreOptions.fault_hook``), the file backend and the compactor call it at the
points their docs name (docs/compaction.md, docs/design.md); tests turn a point into a crash
(``os.kill(os.getpid(), SIGKILL)``), a pause or an exception. ``ctx`` says where the process
is (the session, the key, the step). Production code passes none.
"""

from __future__ import annotations

from typing import Any, Callable

FaultHook = Callable[[str, dict[str, Any]], None]

__all__ = ["FaultHook"]
