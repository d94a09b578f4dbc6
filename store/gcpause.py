"""Python's cyclic GC during a read: paused while the read decodes, and the young objects
the decode makes collected in steps while they are still in the CPU's caches.

Decoding a 10k-entry session (10 MiB, the benchmarks' shape) allocates about 40k dicts and
lists, 25k of which the collector tracks. Left to itself it would run a young collection
every 700 allocations, a middle one every 7,700, and may start a full collection over the
whole heap in the middle of the parse. Paused for the whole read (as the reader did before),
it collects all of them at once when it is re-enabled: one young collection whose traversal
touches every value of every entry, 10 MiB that are no longer in the caches (14-44 ms, median
21-28 ms, measured in a resume; the same objects cost the floor's parse 5-17 ms collected as
they come), and a middle collection that traverses them all again later, cold again (25-29 ms
in the ``build_context`` after the read). So the collector is paused (``gc_paused``) and the
decoder calls ``collect_young`` between chunks of lines: at the collector's own cadence of
middle collections, one collection of the two young generations traverses the objects made
since the last one while they are hot and moves them to the oldest generation, where the
collector would have put them too. Entries are trees of dicts and lists without cycles:
nothing they hold waits for a collection. Reference counting frees everything as usual.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic GC while a read builds many small objects; nestable, and shared
    by the threads that read at the same time (the collector is paused while any of them
    is inside). If the collector was off when the first of them entered, it stays off and
    ``collect_young`` does nothing."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


def collect_young() -> None:
    """While ``gc_paused`` holds the collector off (and it was on before): collect the two
    young generations once as many objects were allocated as the collector itself would
    allow before one of its middle collections (``threshold0 * (threshold1 + 1)``, 7,700 by
    default). So a read makes as many collections of the middle generation as it would with
    the collector on (each of which brings a full collection nearer), and none of the young
    generation's ten times as many.

    Safe from any thread at any time: a collection never needs the collector to be enabled,
    and the objects another thread is building meanwhile are either not tracked yet or
    complete (CPython collects only where the GIL can change hands). ``_depth`` is read
    without the lock: a stale value costs one collection too many or too few, never more.
    """
    if _depth == 0 or not _was_enabled:
        return
    young, middle, _ = gc.get_threshold()
    if young <= 0:  # automatic collection switched off with set_threshold(0)
        return
    if gc.get_count()[0] >= young * (middle + 1):
        gc.collect(1)


__all__ = ["collect_young", "gc_paused"]
