"""One module per scenario; each measures the store and, in the same run, its floor."""
