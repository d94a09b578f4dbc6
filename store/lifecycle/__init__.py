"""A session's life built from the protocols: create, fork and delete (``sessions``),
retention and the trash (``retention``), the maintenance thread (``maintenance``)
(docs/design.md, "Layers")."""
