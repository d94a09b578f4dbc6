"""A store that maintains itself: the compactor's worker in a thread of the process.

The embedded default has no compactor process beside it, and nobody starts one: without one,
a long local session would resume one segment at a time forever. So a store whose options
ask for it (``StoreOptions.compact``: on for the embedded default, ``compact=False`` turns it
off) runs a *maintainer* in one daemon thread of its own, from its first append to its
``close()``. Appends are what queue compaction jobs, so a process that only reads (a command
that lists or exports) starts nothing and pays nothing at open or close; a job queued by a
process that has gone is taken by the next process that writes.

**The seam.** The store never imports the compactor (docs/design.md, "Parts"). A maintainer
is registered instead, under the entry-point group ``sessionstore.maintainers``
(``pyproject.toml``: the compactor's ``compactor.maintenance:maintain``, which runs the
compactor's own worker loop, ``compactor/worker.py``). The store looks the group up in the
thread, so that the append that starts it does not wait for it, and runs the first
maintainer found. None registered (a source tree on ``sys.path`` whose package metadata
predates the entry point: reinstall it) is logged once as a warning, and the store works on
uncompacted.

**The contract of a maintainer**: ``maintain(store, stop)`` maintains ``store`` until the
``threading.Event`` ``stop`` is set, then returns: promptly, except that a step in hand is
finished (a warm stop). It must never block where ``stop`` cannot end the wait. It may be
stopped at any point by the process's death instead, and must leave the store correct then
too (the compactor's protocol does: docs/compaction.md). An exception it raises is logged;
the store goes on without maintenance.

**Stopping.** ``close()`` sets ``stop`` and joins the thread, at most ``CLOSE_WAIT_S``; a
maintainer still busy after that is left to finish as a daemon (what it holds is taken over
by another process later, as after a death). A store never closed is stopped the same way at
interpreter exit (``atexit``, which runs after the program's own threads have ended), so a
script that forgets ``close()`` still finishes the compaction in hand; the thread is a daemon,
so it never keeps the interpreter alive.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from importlib.metadata import entry_points
from typing import Any, Callable

log = logging.getLogger("sessionstore.maintenance")

#: Entry-point group of maintainers: ``name = "module:callable"``, the callable taking
#: ``(store, stop)`` as above.
GROUP = "sessionstore.maintainers"
#: How long ``close()`` waits for the maintainer's warm stop.
CLOSE_WAIT_S = 60.0

#: ``maintain(store, stop)``: the store is the ``SessionStore`` that starts it (typed ``Any``
#: here: this module sits below the facade, and a maintainer is loaded by name anyway).
Maintainer = Callable[[Any, threading.Event], None]

_running: weakref.WeakSet[Maintenance] = weakref.WeakSet()
_warned = False


def find_maintainer() -> Maintainer | None:
    """The first maintainer registered under :data:`GROUP` that loads, or None."""
    global _warned
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        try:
            maintainer: Maintainer = ep.load()
        except Exception as exc:  # an entry point of a broken or older install
            log.warning("maintainer %s (%s) does not load: %s", ep.name, ep.value, exc)
            continue
        return maintainer
    if not _warned:
        _warned = True
        log.warning("no maintainer registered (entry points %r): this process does not compact "
                    "its store; reinstall the package (pip install -e .) or run "
                    "`python -m compactor work`", GROUP)
    return None


class Maintenance:
    """The maintenance thread of one store."""

    def __init__(self, store: Any, find: Callable[[], Maintainer | None] = find_maintainer) -> None:
        self.stop = threading.Event()
        self._thread = threading.Thread(
            target=_run, args=(store, find, self.stop), name="sessionstore-maintenance", daemon=True,
        )
        self._thread.start()
        _running.add(self)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Stop the maintainer (a warm stop) and wait for it, at most ``timeout`` seconds.
        Returns whether it stopped. Called by ``SessionStore.close()`` before the backends
        close."""
        _running.discard(self)
        self.stop.set()
        if self._thread is threading.current_thread():
            return False
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("store maintenance did not stop within %.0f s: left to finish in the "
                        "background (what it holds is taken over by another process)", timeout)
            return False
        return True


def _run(store: Any, find: Callable[[], Maintainer | None], stop: threading.Event) -> None:
    try:
        maintainer = find()
        if maintainer is not None and not stop.is_set():
            maintainer(store, stop)
    except Exception:  # housekeeping never takes the program down
        log.exception("store maintenance failed; the store goes on without it")


@atexit.register
def _stop_all() -> None:
    for maintenance in list(_running):
        maintenance.close()
