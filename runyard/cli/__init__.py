"""The runyard command line: an API client for people and scripts, and the service launcher."""
