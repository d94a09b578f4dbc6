"""Object stores: the seam (``object_store``), its backends (``files``, ``s3``), opening one
by URL (``objects``), the contract every backend is tested against (``testing``) and the
embedded redis-server. Knows no stored format (docs/design.md, "Layers")."""
