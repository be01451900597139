"""Adapters of the runner port (`runyard.runner`): Docker, and a fake for tests."""
