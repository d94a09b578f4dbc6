"""LangGraph's checkpoint saver on the store: ``SessionStoreSaver`` (extra ``langgraph``).

::

    from store.adapters.langgraph import SessionStoreSaver

    with SessionStoreSaver.from_url("s3://bucket/graphs?endpoint=...", "redis://redis:6379/0") as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "t-1"}})

Every method of LangGraph's ``BaseCheckpointSaver``, sync and async, with the extended ones
(``copy_thread`` as a fork of the store session, ``prune``, ``delete_for_runs``). A thread is
one store session; two processes continuing one thread from one checkpoint never fork it
silently: the second gets :class:`CheckpointForkError` (``saver.py``). The entries and the
fold that reads them: ``records.py``. docs/adapters.md, "LangGraph".
"""

from store.adapters.langgraph.records import (
    BLOB_TYPE,
    CHECKPOINT_TYPE,
    DROP_TYPE,
    RUN_TYPE,
    THREAD_TYPE,
    WRITES_TYPE,
)
from store.adapters.langgraph.saver import GUARDED_SOURCES, CheckpointForkError, SessionStoreSaver

__all__ = [
    "BLOB_TYPE",
    "CHECKPOINT_TYPE",
    "DROP_TYPE",
    "GUARDED_SOURCES",
    "RUN_TYPE",
    "THREAD_TYPE",
    "WRITES_TYPE",
    "CheckpointForkError",
    "SessionStoreSaver",
]
