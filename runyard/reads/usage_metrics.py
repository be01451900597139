"""Per-tenant usage counters for Prometheus, read from the tenants' running totals at scrape
time: true whichever process serves them, each attempt counted once."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from runyard.usage.ledger import TenantTotals, UsageLedger

logger = logging.getLogger(__name__)

# Each counter: its name (``_total`` is added), its help, and its figure of the totals.
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("runyard_tenant_attempts_metered", "Attempts whose usage was recorded", "attempts"),
    ("runyard_tenant_cpu_seconds", "CPU seconds used by the tenant's attempts", "cpu_seconds"),
    ("runyard_tenant_wall_seconds", "Container seconds of the tenant's attempts", "wall_seconds"),
    (
        "runyard_tenant_memory_byte_seconds",
        "Average memory times wall time of the tenant's attempts",
        "memory_byte_seconds",
    ),
    ("runyard_tenant_disk_bytes", "Bytes the tenant's attempts left on disk", "disk_bytes"),
    ("runyard_tenant_network_bytes", "Network bytes of the tenant's attempts", "net_bytes"),
)


class UsageCollector(Collector):
    """The usage counters of every tenant: one small read per scrape."""

    def __init__(self, ledger: UsageLedger) -> None:
        self._ledger = ledger

    def collect(self) -> Iterator[CounterMetricFamily]:
        """Read the counters now (none when the database does not answer)."""
        try:
            totals: list[TenantTotals] = self._ledger.totals()
        except Exception:
            logger.warning("usage counters unavailable", exc_info=True)
            totals = []
        for name, documentation, figure in COUNTERS:
            family = CounterMetricFamily(name, documentation, labels=["tenant"])
            for row in totals:
                family.add_metric([row.tenant], float(getattr(row, figure)))
            yield family
