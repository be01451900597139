"""Integration tests of the Docker adapter against the real engine."""
