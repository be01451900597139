"""Integration tests of the worker loop with the fake runner or Docker, against real Postgres."""
