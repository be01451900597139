"""Sync mode: an API process that runs tools inline, as jobs it claims at the insert."""
