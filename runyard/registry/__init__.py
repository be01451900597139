"""The tool registry: entries and their limits, secret references, and masking secrets."""
