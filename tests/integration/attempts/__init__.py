"""Integration tests of the one attempt owner with the fake runner, against real Postgres."""
