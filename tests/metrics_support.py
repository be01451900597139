"""Reading Prometheus text for the metrics tests: which defined series moved, and which the
runs of a test are not expected to move."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from runyard.reads.metrics import Metrics, Role

# Series that ordinary runs leave at zero: each needs an event those tests do not cause.
NEEDS_OTHER_EVENTS = {
    # A worker restarted while its containers ran on.
    "runyard_adoptions": "adopting a container after a worker restart",
    "runyard_leases_lost": "a lease taken away (a reaper pass or another owner)",
    "runyard_requeues": "an attempt put back (retries, handovers, unstarted runs)",
    "runyard_worker_unstorable_outcomes": "an outcome the database refuses",
    "runyard_worker_heartbeat_failures": "a heartbeat round that does not complete in time",
    "runyard_worker_handovers": "leases that cannot be renewed",
    "runyard_worker_loop_errors": "an unexpected error in a worker loop",
    "runyard_worker_db_connections_cut": "a database peer that stops answering",
    "runyard_worker_engine_probe_failures": "a Docker engine outage",
    # Gauges that are rightly zero when the test reads them.
    "runyard_worker_slots_busy": "0 again once the runs are finished",
    "runyard_worker_db_clock_offset_seconds": "about 0 when the database is on the same host",
}


def moved_series(text: str) -> dict[str, bool]:
    """For each family in Prometheus ``text``: whether any of its counts or values is not 0
    (a counter's ``_total``, a histogram's ``_count``, a gauge's value)."""
    moved: dict[str, bool] = {}
    for family in text_string_to_metric_families(text):
        values = [
            sample.value
            for sample in family.samples
            if sample.name in (family.name, f"{family.name}_total", f"{family.name}_count")
        ]
        moved[family.name] = any(value != 0 for value in values)
    return moved


def expected_to_move(*roles: Role) -> set[str]:
    """The series of ``roles`` as the ``Metrics`` class defines them, but those listed in
    ``NEEDS_OTHER_EVENTS``."""
    defined = Metrics()
    return {name for role in roles for name in defined.names(role)} - set(NEEDS_OTHER_EVENTS)


def still_zero(text: str, *roles: Role) -> list[str]:
    """The series of ``roles`` that ``text`` lacks or shows at zero, but the allowed ones."""
    moved = moved_series(text)
    return sorted(name for name in expected_to_move(*roles) if not moved.get(name, False))
