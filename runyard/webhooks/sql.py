"""The named SQL statements of webhook delivery and tenant webhook settings.

Delivery rows are written by triggers when a run starts or becomes terminal (migrations 0009
and 0024) and by ``ENQUEUE_DEADLINE_NOTICES``; these statements offer, claim, hold back and
settle them in each run's order, keep each tenant's circuit breaker per
destination (``webhook_destinations``, migrations 0018 and 0019) and configure tenants.
``{NOW}`` is the injected clock or ``now()``.
"""

from __future__ import annotations

from typing import LiteralString

from sqlalchemy import TextClause, text

_NOW = "coalesce(CAST(:now AS timestamptz), now())"
# A run's deliveries go in the order they were written (started, deadline, completed): one
# waits while an earlier one of its run is pending (in flight or due again later), and goes
# once that one is delivered or given up. Rows from before ``seq`` existed come first.
_IN_RUN_ORDER = """NOT EXISTS (
              SELECT 1 FROM webhook_deliveries earlier
              WHERE earlier.run_id = webhook_deliveries.run_id AND earlier.status = 'pending'
                AND coalesce(earlier.seq, 0) < coalesce(webhook_deliveries.seq, 0))"""


def _sql(statement: LiteralString) -> TextClause:
    return text(statement.replace("{NOW}", _NOW).replace("{IN_RUN_ORDER}", _IN_RUN_ORDER))


# What a claim chooses from (``runyard.domain.webhook_fairness.pick_deliveries``): each tenant's
# oldest due deliveries, at most :per_tenant of them, and every attempt in flight (leased,
# lease not run out) with its tenant, in one read that locks nothing. The tenants with
# pending deliveries are found by a skip scan of ``(tenant, next_attempt_at)``, one index
# probe per tenant, so a claim costs O(tenants * per_tenant) however deep a backlog is. A row
# still holding a token whose lease ran out is due (its process died) and not in flight.
DELIVERY_OFFERS = _sql(
    """
    WITH RECURSIVE tenants (tenant) AS (
        (SELECT tenant FROM webhook_deliveries WHERE status = 'pending'
         ORDER BY tenant LIMIT 1)
        UNION ALL
        SELECT (SELECT d.tenant FROM webhook_deliveries d
                WHERE d.status = 'pending' AND d.tenant > t.tenant
                ORDER BY d.tenant LIMIT 1)
        FROM tenants t WHERE t.tenant IS NOT NULL
    )
    SELECT o.id, o.tenant, o.url, o.next_attempt_at, false AS in_flight, {NOW} AS now
    FROM tenants t CROSS JOIN LATERAL (
        SELECT id, tenant, url, next_attempt_at FROM webhook_deliveries
        WHERE status = 'pending' AND tenant = t.tenant AND next_attempt_at <= {NOW}
          AND {IN_RUN_ORDER}
        ORDER BY next_attempt_at
        LIMIT :per_tenant
    ) o
    WHERE t.tenant IS NOT NULL
    UNION ALL
    SELECT id, tenant, url, next_attempt_at, true, {NOW}
    FROM webhook_deliveries
    WHERE status = 'pending' AND lease_token IS NOT NULL AND next_attempt_at > {NOW}
    """
)

# More offers of the named tenants (:tenants and :after side by side): each one's oldest due
# deliveries from :after on that are not in :seen, at most :limit of them. For tenants whose
# offers all wait for room at their destinations: their deliveries to other destinations may
# come later (bounded: a claim looks this far ahead for a few tenants, never the backlog).
MORE_OFFERS = _sql(
    """
    SELECT o.id, o.tenant, o.url, o.next_attempt_at
    FROM unnest(CAST(:tenants AS text[]), CAST(:after AS timestamptz[])) AS t(tenant, after)
    CROSS JOIN LATERAL (
        SELECT id, tenant, url, next_attempt_at FROM webhook_deliveries
        WHERE status = 'pending' AND tenant = t.tenant
          AND next_attempt_at >= t.after AND next_attempt_at <= {NOW}
          AND id <> ALL(CAST(:seen AS uuid[]))
          AND {IN_RUN_ORDER}
        ORDER BY next_attempt_at
        LIMIT :limit
    ) o
    """
)

# The breaker states of the named tenants' destinations (:tenants and :destinations side by
# side); one without a row is closed.
DESTINATION_STATES = _sql(
    """
    SELECT s.tenant, s.destination, s.failures, s.open_until
    FROM unnest(CAST(:tenants AS text[]), CAST(:destinations AS text[])) AS k(tenant, destination)
    JOIN webhook_destinations s ON s.tenant = k.tenant AND s.destination = k.destination
    """
)

# The claim's transaction-level locks: one per tenant and per destination it claims for
# (:keys), taken in one order (so two claims never wait for each other in a circle) and held
# until it commits. A claim counts the attempts in flight (IN_FLIGHT) only once it holds them,
# so no other process claims for the same tenant or destination between its count and its
# claim: the caps hold across processes. Two keys with the same hash share a lock, which only
# makes two claims wait for each other.
LOCK_CLAIM = _sql(
    """
    SELECT count(pg_advisory_xact_lock(hashtext('runyard.webhook_claim'), k)) AS locked
    FROM (SELECT DISTINCT hashtext(key) AS k FROM unnest(CAST(:keys AS text[])) AS key
          ORDER BY 1) AS ordered
    """
)

# Every attempt in flight (leased, lease not run out), with its tenant and URL.
IN_FLIGHT = _sql(
    """
    SELECT tenant, url FROM webhook_deliveries
    WHERE status = 'pending' AND lease_token IS NOT NULL AND next_attempt_at > {NOW}
    """
)

# The picked deliveries, each claimed under a fresh lease_token for :lease seconds, in the
# order of :ids: the claim moves next_attempt_at a lease ahead, so a delivery whose process
# dies is due again after it (at least once). Rows taken meanwhile by another claim (locked,
# or no longer due) are skipped. A probe (:probe_ids, to :probe_destinations) is claimed only
# if its row was (not skipped) and this statement is the one that marks its tenant's breaker
# there open for the lease (the update waits for a concurrent one and re-checks), so a breaker
# gets one probe at a time, and one whose probe was not claimed stays as it was. A row still
# holding a token was claimed by a process that never settled it: its attempt is told in the
# run's events as interrupted (it may or may not have arrived).
CLAIM_DELIVERIES = _sql(
    """
    WITH due AS MATERIALIZED (
        SELECT id, tenant, lease_token IS NOT NULL AS interrupted
        FROM webhook_deliveries
        WHERE id = ANY(CAST(:ids AS uuid[]))
          AND status = 'pending' AND next_attempt_at <= {NOW}
          AND {IN_RUN_ORDER}
        ORDER BY array_position(CAST(:ids AS uuid[]), id)
        FOR UPDATE SKIP LOCKED
    ), probing AS (
        UPDATE webhook_destinations s
        SET open_until = {NOW} + make_interval(secs => CAST(:lease AS double precision)),
            updated_at = {NOW}
        FROM unnest(CAST(:probe_ids AS uuid[]), CAST(:probe_destinations AS text[]))
             AS p(id, destination)
        JOIN due ON due.id = p.id
        WHERE s.tenant = due.tenant AND s.destination = p.destination
          AND coalesce(s.open_until, '-infinity') <= {NOW}
        RETURNING p.id
    ), claimed AS (
        UPDATE webhook_deliveries d
        SET attempts = d.attempts + 1, lease_token = gen_random_uuid(), locked_by = :owner,
            next_attempt_at = {NOW} + make_interval(secs => CAST(:lease AS double precision))
        FROM due
        WHERE d.id = due.id
          AND (due.id <> ALL(CAST(:probe_ids AS uuid[])) OR due.id IN (SELECT id FROM probing))
        RETURNING d.id, d.run_id, d.tenant, d.url, d.attempts, d.lease_token, due.interrupted,
                  d.event, d.data
    ), interrupted AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT run_id, {NOW}, 'webhook',
               jsonb_build_object('delivery_id', id, 'attempt', attempts - 1,
                                  'outcome', 'interrupted',
                                  'error', 'the delivering process stopped before it knew')
        FROM claimed WHERE interrupted
    )
    SELECT c.id, c.run_id, c.tenant, c.url, c.attempts, c.lease_token, c.event, c.data,
           s.webhook_secret AS secret
    FROM claimed c LEFT JOIN tenant_settings s ON s.tenant = c.tenant
    ORDER BY array_position(CAST(:ids AS uuid[]), c.id)
    """
)

# Deliveries whose destination's breaker is open, held until its cool-down ends (:ids and
# :untils side by side): not an attempt, so nothing counts and nothing is recorded; unless
# that is past :window seconds after the run ended, then given up now with a ``gave_up``
# event, as a failed attempt would have been. A row held by a lease that ran out is also
# told as interrupted and released. Rows locked by a claim, or no longer due, are skipped.
DEFER_DELIVERIES = _sql(
    """
    WITH target AS MATERIALIZED (
        SELECT d.id, t.until, d.lease_token IS NOT NULL AS interrupted,
               t.until > d.created_at + make_interval(secs => CAST(:window AS double precision))
                   AS expired
        FROM unnest(CAST(:ids AS uuid[]), CAST(:untils AS timestamptz[])) AS t(id, until)
        JOIN webhook_deliveries d ON d.id = t.id
        WHERE d.status = 'pending' AND d.next_attempt_at <= {NOW}
        FOR UPDATE OF d SKIP LOCKED
    ), held AS (
        UPDATE webhook_deliveries d
        SET status = CASE WHEN t.expired THEN 'failed' ELSE 'pending' END,
            next_attempt_at = CASE WHEN t.expired THEN d.next_attempt_at ELSE t.until END,
            finished_at = CASE WHEN t.expired THEN {NOW} END,
            last_error = CASE WHEN t.expired THEN CAST(:error AS text) ELSE d.last_error END,
            lease_token = NULL, locked_by = NULL
        FROM target t WHERE d.id = t.id
        RETURNING d.id, d.run_id, d.attempts, d.status, t.interrupted
    ), event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT h.run_id, {NOW}, 'webhook', e.data
        FROM held h CROSS JOIN LATERAL (VALUES
            (1, CASE WHEN h.interrupted THEN jsonb_build_object(
                'delivery_id', h.id, 'attempt', h.attempts, 'outcome', 'interrupted',
                'error', 'the delivering process stopped before it knew') END),
            (2, CASE WHEN h.status = 'failed' THEN jsonb_build_object(
                'delivery_id', h.id, 'attempt', h.attempts, 'outcome', 'gave_up',
                'error', CAST(:error AS text)) END)
        ) AS e(n, data)
        WHERE e.data IS NOT NULL
        ORDER BY h.run_id, h.id, e.n
    )
    SELECT id, status FROM held
    """
)

# The tenant's breaker state of a destination that just failed for it, its row locked until
# the commit (made closed if it had none): the caller computes the next state and saves it in
# the same transaction, so concurrent failures count one after the other.
LOCK_DESTINATION = _sql(
    """
    INSERT INTO webhook_destinations AS s (tenant, destination, failures, open_until, updated_at)
    VALUES (:tenant, :destination, 0, NULL, {NOW})
    ON CONFLICT (tenant, destination) DO UPDATE SET updated_at = s.updated_at
    RETURNING failures, open_until, {NOW} AS now
    """
)

SAVE_DESTINATION = _sql(
    """
    UPDATE webhook_destinations
    SET failures = :failures, open_until = CAST(:open_until AS timestamptz), updated_at = {NOW}
    WHERE tenant = :tenant AND destination = :destination
    """
)

# An answer closes the tenant's breaker there: a closed breaker has no row.
CLOSE_DESTINATION = _sql(
    "DELETE FROM webhook_destinations WHERE tenant = :tenant AND destination = :destination"
)

# Breaker states untouched for :age seconds: every delivery they held back has been settled
# or given up by then, so the destination starts closed again.
PRUNE_DESTINATIONS = _sql(
    """
    DELETE FROM webhook_destinations
    WHERE updated_at < {NOW} - make_interval(secs => CAST(:age AS double precision))
    """
)

# The outcome of one attempt, fenced by (id, lease_token): delivered; or due again after
# :delay seconds; or given up when that would be past :window seconds after the run ended.
# Each attempt becomes a ``webhook`` event of the run in the same transaction.
SETTLE_DELIVERY = _sql(
    """
    WITH verdict AS (
        SELECT id,
               CASE WHEN :delivered THEN 'delivered'
                    WHEN {NOW} + make_interval(secs => CAST(:delay AS double precision))
                         > created_at + make_interval(secs => CAST(:window AS double precision))
                    THEN 'failed'
                    ELSE 'pending' END AS status
        FROM webhook_deliveries WHERE id = :id AND lease_token = :token
    ), settled AS (
        UPDATE webhook_deliveries d
        SET status = v.status,
            next_attempt_at = CASE WHEN v.status = 'pending'
                THEN {NOW} + make_interval(secs => CAST(:delay AS double precision))
                ELSE d.next_attempt_at END,
            finished_at = CASE WHEN v.status <> 'pending' THEN {NOW} END,
            lease_token = NULL, locked_by = NULL,
            last_status_code = CAST(:status_code AS integer), last_error = CAST(:error AS text)
        FROM verdict v
        WHERE d.id = v.id AND d.lease_token = :token
        RETURNING d.id, d.run_id, d.attempts, d.status, d.next_attempt_at
    ), event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT run_id, {NOW}, 'webhook', jsonb_strip_nulls(jsonb_build_object(
            'delivery_id', id, 'attempt', attempts,
            'status_code', CAST(:status_code AS integer), 'error', CAST(:error AS text),
            'outcome', CASE status WHEN 'delivered' THEN 'delivered'
                                   WHEN 'failed' THEN 'gave_up' ELSE 'retrying' END,
            'next_attempt_at', CASE WHEN status = 'pending' THEN next_attempt_at END))
        FROM settled
    )
    SELECT status FROM settled
    """
)

# Each running attempt's ``run.deadline_approaching`` notice, once its deadline is within the
# tenant's lead time (for tenants that take the event): the deadline is the job's, which an
# adopting worker keeps, and the unique index on (run, event, attempt) makes the notice exist
# once however many delivering processes write it, a crash between included. Only tenants
# that asked for it are read, and of theirs only running runs.
ENQUEUE_DEADLINE_NOTICES = _sql(
    """
    INSERT INTO webhook_deliveries (id, run_id, tenant, url, created_at, next_attempt_at,
                                    event, attempt, data)
    SELECT gen_random_uuid(), r.id, r.tenant, coalesce(r.callback_url, s.webhook_url),
           {NOW}, {NOW}, 'run.deadline_approaching', j.attempts,
           jsonb_build_object('deadline_at', j.deadline_at)
    FROM tenant_settings s
    JOIN tool_runs r ON r.tenant = s.tenant AND r.status = 'running'
    JOIN tool_run_jobs j ON j.run_id = r.id
    WHERE 'run.deadline_approaching' = ANY(s.webhook_events)
      AND coalesce(r.callback_url, s.webhook_url) IS NOT NULL
      AND j.status = 'running' AND j.deadline_at > {NOW}
      AND j.deadline_at <= {NOW} + make_interval(secs => s.deadline_lead_seconds)
    ON CONFLICT DO NOTHING
    RETURNING run_id
    """
)

# A tenant's default URL, and a new secret when it has none or :rotate asks for one;
# ``secret_stored`` says whether :secret is now the tenant's (the one time it is shown).
# :events and :lead change the events it takes and the deadline notice's lead (NULL: keep).
CONFIGURE_TENANT = _sql(
    """
    INSERT INTO tenant_settings AS s (tenant, webhook_url, webhook_secret, updated_at,
                                      webhook_events, deadline_lead_seconds)
    VALUES (:tenant, :url, :secret, {NOW},
            coalesce(CAST(:events AS text[]), ARRAY['run.completed']),
            coalesce(CAST(:lead AS integer), 60))
    ON CONFLICT (tenant) DO UPDATE
    SET webhook_url = excluded.webhook_url,
        webhook_secret = CASE WHEN :rotate OR s.webhook_secret IS NULL
                              THEN excluded.webhook_secret ELSE s.webhook_secret END,
        webhook_events = coalesce(CAST(:events AS text[]), s.webhook_events),
        deadline_lead_seconds = coalesce(CAST(:lead AS integer), s.deadline_lead_seconds),
        updated_at = excluded.updated_at
    RETURNING webhook_url, webhook_secret = :secret AS secret_stored, webhook_events,
              deadline_lead_seconds
    """
)

TENANT_WEBHOOK = _sql(
    """
    SELECT webhook_url, webhook_secret IS NOT NULL AS has_secret, updated_at, webhook_events,
           deadline_lead_seconds
    FROM tenant_settings WHERE tenant = :tenant
    """
)
