"""Side by side: each framework's own default session backend and its sessionstore adapter
on the same workload (``python -m benchmarks --only peers``)."""
