"""Bytes and names, no I/O: the stored formats (entries, segments, records, encryption,
schemas, markers, object keys). Imports only its own modules, ``store.model``, ``store.pi``
and the shared errors, clock, faults and retry policy (docs/design.md, "Layers")."""
