"""Integration tests of the queue, its statements and the reaper, against real Postgres."""
