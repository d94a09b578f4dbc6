"""pi session files (JSONL, format v3) in and out, as ``@mariozechner/pi-coding-agent`` 0.73.1
reads and writes them (``tests/fixtures/pi/SPEC.md``, ``docs/pi-format.md``).

- :mod:`store.pi.lines`: where the lines come from (paths, bytes, streams), read once or again.
- :mod:`store.pi.parse`: ``JSON.parse`` of each line as pi does it, the header rule.
- :mod:`store.pi.migrate`: v1 and v2 files migrated to v3 (deterministic minted ids).
- :mod:`store.pi.checks`: the model's rules applied to a file's entries (pass 1).
- :mod:`store.pi.scan`: the readers: ``read_pi_file``, ``parse_pi_lines``, and the streaming
  two-pass ``scan_pi_file`` / ``iter_pi_entries``.
- :mod:`store.pi.export`: ``export_pi_bytes`` / ``export_pi_lines``.

The semantics they share live in :mod:`store.model`. This package imports none of its
modules: import them by name.
"""
