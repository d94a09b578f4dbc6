"""OpenTelemetry spans (store/tracing.py): an append, a read and a compaction each make one
span with the session id as ``gen_ai.conversation.id``, a failure is recorded on its span,
and nothing of an entry's content is in any of them. The process that checks them configures
the SDK with its in-memory exporter, as an application would configure its own (a tracer
provider is set once per process, so it runs apart from the test's)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent('''
    import json, sys
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from compactor import Compactor, CompactorOptions
    from store import SessionStore
    from store.errors import ConflictError

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    def entry(eid, parent):
        return {"type": "message", "id": eid, "parentId": parent, "timestamp": "2026-11-29T00:00:00.000Z",
                "message": {"role": "user", "content": "SECRET-CONTENT " + eid}}

    store = SessionStore.from_url(sys.argv[1], compact=False)
    store.create_session("traced")
    exporter.clear()
    store.append_session_entries("traced", [entry("a", None), entry("b", "a")])
    try:
        store.append_session_entries("traced", [entry("c", "a")], expected_tail_entry_id="a")
    except ConflictError:
        pass
    store.load_session_entries("traced")
    Compactor(store, CompactorOptions(worker="t")).compact_session("traced")
    out = [{"name": s.name, "kind": s.kind.name, "status": s.status.status_code.name,
            "attributes": dict(s.attributes), "events": [e.name for e in s.events]}
           for s in exporter.get_finished_spans()]
    store.close()
    print(json.dumps(out))
''')


def test_an_append_a_read_and_a_compaction_are_spans_of_their_session(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, (tmp_path / "store").as_uri()], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spans = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = [s for s in spans if s["name"].startswith("sessionstore.")]
    names = [s["name"] for s in ours]
    assert names.count("sessionstore.append") == 2 and "sessionstore.read" in names
    assert "sessionstore.compact" in names
    for s in ours:
        assert s["kind"] == "CLIENT"
        assert s["attributes"]["gen_ai.conversation.id"] == "traced"
        assert s["attributes"]["db.system.name"] == "sessionstore"
    ok, refused = [s for s in ours if s["name"] == "sessionstore.append"]
    assert ok["attributes"]["sessionstore.entries"] == 2 and ok["attributes"]["sessionstore.outcome"] == "ok"
    assert ok["status"] == "UNSET"
    assert refused["attributes"]["sessionstore.outcome"] == "conflict"
    assert refused["status"] == "ERROR" and "exception" in refused["events"]
    read = next(s for s in ours if s["name"] == "sessionstore.read")
    assert read["attributes"]["sessionstore.entries"] == 2
    compact = next(s for s in ours if s["name"] == "sessionstore.compact")
    assert compact["attributes"]["sessionstore.outcome"] == "compacted"
    assert "SECRET-CONTENT" not in proc.stdout


QUIET = textwrap.dedent('''
    import sys
    PREAMBLE
    from store import SessionStore
    from store.tracing import span

    store = SessionStore.from_url(sys.argv[1], compact=False)
    store.create_session("quiet")
    store.append_session_entries("quiet", [{"type": "message", "id": "a", "parentId": None,
        "timestamp": "2026-11-29T00:00:00.000Z", "message": {"role": "user", "content": "x"}}])
    assert len(store.load_session_entries("quiet")) == 1
    with span("append", "quiet") as s:
        assert CHECK
    store.close()
    print("ok")
''')


@pytest.mark.parametrize("preamble, check", [
    # the API in the process, no provider configured: its spans record nothing
    ("from opentelemetry import trace", "not s.is_recording()"),
    # the package unimportable, as when not installed: the store never imports it
    ('sys.modules["opentelemetry"] = None', 'not hasattr(s, "is_recording")'),
], ids=["no-provider", "no-package"])
def test_without_a_provider_or_the_package_the_store_works_and_records_nothing(
    preamble: str, check: str, tmp_path: Path,
) -> None:
    script = QUIET.replace("PREAMBLE", preamble).replace("CHECK", check)
    proc = subprocess.run([sys.executable, "-c", script, (tmp_path / "store").as_uri()], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
