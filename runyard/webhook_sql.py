"""The named SQL statements of webhook delivery and tenant webhook settings.

Delivery rows are written by a trigger when a run becomes terminal (migration 0009); these
statements claim, settle and configure them. ``{NOW}`` is the injected clock or ``now()``.
"""

from __future__ import annotations

from typing import LiteralString

from sqlalchemy import TextClause, text

_NOW = "coalesce(CAST(:now AS timestamptz), now())"


def _sql(statement: LiteralString) -> TextClause:
    return text(statement.replace("{NOW}", _NOW))


# Due deliveries, each claimed under a fresh lease_token for :lease seconds: the claim moves
# next_attempt_at a lease ahead, so a delivery whose process dies is due again after it (at
# least once). A row still holding a token was claimed by a process that never settled it:
# its attempt is told in the run's events as interrupted (it may or may not have arrived).
CLAIM_DELIVERIES = _sql(
    """
    WITH due AS MATERIALIZED (
        SELECT id, lease_token IS NOT NULL AS interrupted
        FROM webhook_deliveries
        WHERE status = 'pending' AND next_attempt_at <= {NOW}
        ORDER BY next_attempt_at
        LIMIT :batch
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
    SELECT c.id, c.run_id, c.url, c.attempts, c.lease_token, s.webhook_secret AS secret
    FROM claimed c LEFT JOIN tenant_settings s ON s.tenant = c.tenant
    ORDER BY c.attempts
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
