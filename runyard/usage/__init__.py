"""Metered usage: each attempt's consumption recorded once under its lease, and its reports."""
