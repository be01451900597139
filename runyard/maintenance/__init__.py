"""Maintenance: retention, the sweep of containers nothing needs, and the chores that run them."""
