"""Adapters of the artifact store port (`runyard.artifact_store`): Postgres and a local folder."""
