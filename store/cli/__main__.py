"""``python -m store.cli``: the same as the ``sessionstore`` command."""

from __future__ import annotations

import sys

from store.cli import main

if __name__ == "__main__":
    sys.exit(main())
