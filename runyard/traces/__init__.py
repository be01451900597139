"""Runs' trace contexts: stored with the run so every process that touches it joins its trace."""
