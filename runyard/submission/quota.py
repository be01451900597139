"""The optional daily CPU quota of each tenant: once its attempts used the day's CPU seconds,
its new runs are refused until the next UTC midnight."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from runyard.domain.usage import quota_spent, seconds_to_day_end
from runyard.queue.values import AdmissionRefused
from runyard.usage.ledger import UsageLedger


class QuotaSpent(AdmissionRefused):
    """The tenant's daily CPU seconds are spent: a 429 until the day ends."""

    def __init__(self, quota: float, spent: float, retry_after: int) -> None:
        Exception.__init__(
            self,
            f"this tenant's daily quota of {quota:g} CPU seconds is spent ({spent:.1f} s used"
            f" since 00:00 UTC); new runs are refused until the day ends in {retry_after} s",
        )
        self.reason = "tenant_cpu_quota"
        self.limit = round(quota)
        self.retry_after = retry_after


class DailyQuota:
    """Checks a tenant's CPU seconds of the day against the quota (0: none, nothing read).

    One primary-key read per submit (``tenant_usage_days``). It is a soft limit: the runs
    admitted before it was spent still run, and theirs is counted when they end.
    """

    def __init__(
        self,
        ledger: UsageLedger,
        cpu_seconds: float,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._ledger = ledger
        self._quota = cpu_seconds
        self._now = now

    def check(self, tenant: str) -> None:
        """Raise ``QuotaSpent`` if the tenant's quota of the day is used up."""
        if self._quota <= 0:
            return
        spent = self._ledger.cpu_seconds_today(tenant)
        if quota_spent(spent, self._quota):
            raise QuotaSpent(self._quota, spent, seconds_to_day_end(self._now()))
