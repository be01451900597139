"""Completion webhooks: destinations checked, names resolved at delivery, fair turns between
tenants, signed attempts, and the tenants' webhook settings."""
