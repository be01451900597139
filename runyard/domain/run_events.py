"""The types of a run's events (``tool_run_events.type``), by who writes them: the one list
the API's event schemas and the queue's reservation are checked against."""

from __future__ import annotations

# The queue's own transitions write these (runyard.queue.sql and .build_sql): a status
# change, a claim or an adoption, a lease given back or lost, a cancel asked for, and the
# live log chunks of the current attempt.
TRANSITION_EVENT_TYPES = frozenset(
    {
        "status",
        "claimed",
        "adopted",
        "released",
        "requeued",
        "lease_expired",
        "cancel_requested",
        "stdout",
        "stderr",
    }
)

# A workflow run's wait (runyard.queue.graph_sql) and its end (the trigger of migration 0011).
WORKFLOW_EVENT_TYPES = frozenset({"waiting", "dependencies_met"})

# A completion webhook's delivery attempts (runyard.webhooks.sql).
WEBHOOK_EVENT_TYPES = frozenset({"webhook"})

# Notes an attempt's runner records under its lease (``JobQueue.record_event``): the watch's
# warning that a tool printed nothing for a while, and each connection the egress proxy of a
# tool with an allow-list let through or refused.
ATTEMPT_NOTE_TYPES = frozenset({"stale", "egress"})

RUN_EVENT_TYPES = (
    TRANSITION_EVENT_TYPES | WORKFLOW_EVENT_TYPES | WEBHOOK_EVENT_TYPES | ATTEMPT_NOTE_TYPES
)
