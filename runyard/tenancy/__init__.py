"""Tenancy: API keys and who a request acts for."""
