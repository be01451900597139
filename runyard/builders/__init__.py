"""Adapters of the builder port (`runyard.builder`): Docker, and a fake for tests."""
