"""Benchmarks: ``python -m bench.<name>`` prints a table and a last line with its headline.

Never part of the pass/fail suite. Every benchmark talks to loopback only (Postgres, the API
it starts, the local Docker engine), is bounded in time, and cleans up what it started.
See ``docs/benchmarks.md`` for the commands, the machine and the figures.
"""
