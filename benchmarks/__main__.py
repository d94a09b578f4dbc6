"""``python -m benchmarks [--smoke | --full] [--embedded | --objects URL --redis URL]``."""

from __future__ import annotations

import sys

from benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main())
