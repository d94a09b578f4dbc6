"""Benchmarks of the session store, each against the floor it cannot beat, measured in the same run.

Run ``python -m benchmarks`` (see benchmarks/README.md and docs/performance.md).
"""
