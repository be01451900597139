"""Recurring schedules: their records (``store``), the named statements (``sql``) and the
scheduler loop that fires their slots (``scheduler``)."""
