"""The named SQL statements of webhook delivery and tenant webhook settings.

Delivery rows are written by a trigger when a run becomes terminal (migration 0009); these
statements offer, claim, hold back and settle them, keep each destination's circuit breaker
(``webhook_destinations``, migration 0018) and configure tenants. ``{NOW}`` is the injected
clock or ``now()``.
"""

from __future__ import annotations

from typing import LiteralString

from sqlalchemy import TextClause, text

_NOW = "coalesce(CAST(:now AS timestamptz), now())"


def _sql(statement: LiteralString) -> TextClause:
    return text(statement.replace("{NOW}", _NOW))


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

# The breaker state of the named destinations; a destination without a row is closed.
DESTINATION_STATES = _sql(
    """
    SELECT destination, failures, open_until FROM webhook_destinations
    WHERE destination = ANY(CAST(:destinations AS text[]))
    """
)

# The picked deliveries, each claimed under a fresh lease_token for :lease seconds, in the
# order of :ids: the claim moves next_attempt_at a lease ahead, so a delivery whose process
# dies is due again after it (at least once). Rows taken meanwhile by another claim (locked,
# or no longer due) are skipped. A probe (:probe_ids, of :probe_destinations) is claimed only
# if this statement is the one that marks its destination open for the lease (the update
# waits for a concurrent one and re-checks), so a destination gets one probe at a time. A row
# still holding a token was claimed by a process that never settled it: its attempt is told
# in the run's events as interrupted (it may or may not have arrived).
CLAIM_DELIVERIES = _sql(
    """
    WITH probing AS (
        UPDATE webhook_destinations s
        SET open_until = {NOW} + make_interval(secs => CAST(:lease AS double precision)),
            updated_at = {NOW}
        FROM unnest(CAST(:probe_ids AS uuid[]), CAST(:probe_destinations AS text[]))
             AS p(id, destination)
        WHERE s.destination = p.destination
          AND coalesce(s.open_until, '-infinity') <= {NOW}
        RETURNING p.id
    ), due AS MATERIALIZED (
        SELECT id, lease_token IS NOT NULL AS interrupted
        FROM webhook_deliveries
        WHERE id = ANY(CAST(:ids AS uuid[]))
          AND status = 'pending' AND next_attempt_at <= {NOW}
          AND (id <> ALL(CAST(:probe_ids AS uuid[])) OR id IN (SELECT id FROM probing))
        ORDER BY array_position(CAST(:ids AS uuid[]), id)
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE webhook_deliveries d
        SET attempts = d.attempts + 1, lease_token = gen_random_uuid(), locked_by = :owner,
            next_attempt_at = {NOW} + make_interval(secs => CAST(:lease AS double precision))
        FROM due WHERE d.id = due.id
        RETURNING d.id, d.run_id, d.tenant, d.url, d.attempts, d.lease_token, due.interrupted
    ), interrupted AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT run_id, {NOW}, 'webhook',
               jsonb_build_object('delivery_id', id, 'attempt', attempts - 1,
                                  'outcome', 'interrupted',
                                  'error', 'the delivering process stopped before it knew')
        FROM claimed WHERE interrupted
    )
    SELECT c.id, c.run_id, c.tenant, c.url, c.attempts, c.lease_token,
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

# The breaker state of a destination that just failed, its row locked until the commit (made
# closed if it had none): the caller computes the next state and saves it in the same
# transaction, so concurrent failures count one after the other.
LOCK_DESTINATION = _sql(
    """
    INSERT INTO webhook_destinations AS s (destination, failures, open_until, updated_at)
    VALUES (:destination, 0, NULL, {NOW})
    ON CONFLICT (destination) DO UPDATE SET updated_at = s.updated_at
    RETURNING failures, open_until, {NOW} AS now
    """
)

SAVE_DESTINATION = _sql(
    """
    UPDATE webhook_destinations
    SET failures = :failures, open_until = CAST(:open_until AS timestamptz), updated_at = {NOW}
    WHERE destination = :destination
    """
)

# An answer closes the breaker: a closed destination has no row.
CLOSE_DESTINATION = _sql("DELETE FROM webhook_destinations WHERE destination = :destination")

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

# A tenant's default URL, and a new secret when it has none or :rotate asks for one;
# ``secret_stored`` says whether :secret is now the tenant's (the one time it is shown).
CONFIGURE_TENANT = _sql(
    """
    INSERT INTO tenant_settings AS s (tenant, webhook_url, webhook_secret, updated_at)
    VALUES (:tenant, :url, :secret, {NOW})
    ON CONFLICT (tenant) DO UPDATE
    SET webhook_url = excluded.webhook_url,
        webhook_secret = CASE WHEN :rotate OR s.webhook_secret IS NULL
                              THEN excluded.webhook_secret ELSE s.webhook_secret END,
        updated_at = excluded.updated_at
    RETURNING webhook_url, webhook_secret = :secret AS secret_stored
    """
)

TENANT_WEBHOOK = _sql(
    """
    SELECT webhook_url, webhook_secret IS NOT NULL AS has_secret, updated_at
    FROM tenant_settings WHERE tenant = :tenant
    """
)
