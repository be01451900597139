"""Sandboxes: long-lived containers held as runs, with commands and files (docs/sandboxes.md)."""
