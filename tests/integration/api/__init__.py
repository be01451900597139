"""Integration tests of the HTTP API, the dashboard over HTTP and the CLI, against real Postgres."""
