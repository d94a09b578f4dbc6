"""OpenTelemetry spans of the store's operations: optional, and a no-op unless configured.

In a process that uses OpenTelemetry (``opentelemetry-api``, the ``tracing`` extra) each
append, whole read and compaction is a span of the tracer ``sessionstore``, made through the
API's global tracer provider: until the application configures one (``opentelemetry-sdk``,
or the ``opentelemetry-instrument`` agent) the API's spans record nothing. The store never
imports the API itself (configuring a provider does): a process where nothing uses
OpenTelemetry pays nothing for the spans, not even the import (about 40 ms).

Spans (kind ``CLIENT``: calls to the object store and Redis), docs/operations.md "Traces":

- ``sessionstore.append``: ``db.operation.name`` ``append``, ``sessionstore.entries`` (the
  batch), ``sessionstore.outcome`` (``ok``, ``conflict``, ``indeterminate``, ``error``, as
  the metrics say);
- ``sessionstore.read``: ``db.operation.name`` ``read``, ``sessionstore.entries`` (read);
- ``sessionstore.compact``: ``db.operation.name`` ``compact``, ``sessionstore.outcome``.

Each has ``db.system.name`` ``sessionstore`` and the session id as ``gen_ai.conversation.id``
(OpenTelemetry's GenAI conventions: the id of the conversation a span belongs to). A failure
is recorded on its span (the exception event and an error status) and raised as it was.
Never an entry's content, a tenant or a token.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class _NoSpan:
    def set_attribute(self, key: str, value: Any) -> None:
        pass


_NO_SPAN = _NoSpan()


@contextmanager
def span(operation: str, session_id: str, **attributes: Any) -> Iterator[Any]:
    """A span ``sessionstore.<operation>`` around the block; yields it (``set_attribute``)."""
    trace = sys.modules.get("opentelemetry.trace")  # imported by whoever configured tracing
    if trace is None:
        yield _NO_SPAN
        return
    attrs = {"db.system.name": "sessionstore", "db.operation.name": operation,
             "gen_ai.conversation.id": session_id}
    attrs.update({f"sessionstore.{k}": v for k, v in attributes.items()})
    # The global provider is looked up on each span: one configured after the store was
    # made is used from then on.
    tracer = trace.get_tracer("sessionstore")
    with tracer.start_as_current_span(f"sessionstore.{operation}", kind=trace.SpanKind.CLIENT,
                                      attributes=attrs) as current:
        yield current


__all__ = ["span"]
