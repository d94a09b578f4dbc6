"""The maintainer a store runs in a thread of its own (``store/lifecycle/maintenance.py``): the
compactor's worker loop (``compactor/worker.py``), unchanged in what it does.

It takes jobs from the same queue, through the same consumer group, with the same claims as
``python -m compactor work``, and runs the same GC threads (scheduled GC, the sweep) under
the same leases (not retention: trashing sessions stays with the program, docs/lifecycle.md); so several processes on one directory, and worker
processes beside them, share the work as a fleet of workers does, and a process that pauses
or dies at any point leaves nothing a worker's death would not (its job is taken over after
``claim_idle_ms``, its half-written bases are orphans GC removes after the grace period).
The thresholds are the store's own (``StoreOptions.compact_after_*``) and the compactor's
defaults (grace period, base size).

What differs is how it waits and stops: between jobs it waits on the store's stop event with
a growing timeout (``WorkerOptions.idle_max_ms``) instead of a blocked XREADGROUP, so that
``close()`` ends the wait at once; the stop is warm (the compaction in hand finishes).
"""

from __future__ import annotations

import threading

from compactor.compact import Compactor
from compactor.config import WorkerOptions
from compactor.worker import Worker
from store.core import SessionStore

#: Between jobs: the first wait (ms) after an empty ask, doubled while the queue stays empty,
#: up to the second. A job queued while this process writes waits at most that long.
IDLE_MIN_MS = 50
IDLE_MAX_MS = 2_000
#: Scheduled GC is due a grace period (minutes) after a compaction: looking every 10 s
#: instead of every second costs a local store a tenth of the requests (16 buckets a look).
GC_POLL_MS = 10_000


def maintain(store: SessionStore, stop: threading.Event) -> None:
    """Run the compactor's worker on ``store`` until ``stop`` is set (the store's maintainer,
    registered under the entry point ``sessionstore.maintainers``)."""
    worker = Worker(
        # The store's fault hook sees the compactor's points too (docs/compaction.md).
        Compactor(store, fault_hook=store.options.fault_hook),
        # Retention is not maintenance: trashing a session is a policy the program runs
        # (compactor/retention.py, docs/lifecycle.md), not something opening a store starts.
        WorkerOptions(block_ms=IDLE_MIN_MS, idle_max_ms=IDLE_MAX_MS, gc_poll_ms=GC_POLL_MS,
                      retention_poll_ms=0),
        stop=stop,
    )
    worker.run()
