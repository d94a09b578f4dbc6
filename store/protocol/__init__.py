"""The store's protocols on the object store and Redis: append, read, tail, listing, headers,
manifests, data keys, forks, follow, and ``StoreContext``, what they share. Imports the
formats and the backends, nothing above (docs/design.md, "Layers")."""
