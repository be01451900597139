"""Submitting work: a run request checked and prepared, the submit use case, and batches."""
