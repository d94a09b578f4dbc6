"""The session model: pure, no I/O, nothing of the store but its errors.

- :mod:`store.model.js`: JavaScript semantics (``String``, ``Number``, ``trim``, truthiness,
  ``new Date``) that pi's results depend on.
- :mod:`store.model.js_json`: JSON as JavaScript parses and writes it (``JSON.stringify``
  byte for byte, lone surrogates included).
- :mod:`store.model.rules`: the entry rules, once (``validate_entry``, no parent cycles,
  redaction tombstones).
- :mod:`store.model.context`: walks of the entry tree (``getBranch``, ``buildSessionContext``).
- :mod:`store.model.session`: ``Session``, the snapshot (tree, labels, name, redaction).

This package imports none of its modules: import them by name.
"""
