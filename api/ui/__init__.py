"""The operator dashboard under /ui."""
