"""Runs' trace contexts: carried in the run's snapshot, so every process that claims the run
joins its trace without a read of its own."""
