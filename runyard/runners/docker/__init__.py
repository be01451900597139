"""The Docker adapter of the runner port: hardened, labelled, adoptable containers.

``runner`` runs and adopts attempts; ``outputs`` reads logs and ``result.json`` from the
engine; ``host_workdirs`` writes inputs beside the engine; ``live_logs`` follows a running
container's log; ``watch`` enforces the disk and idle limits; ``engine_marker`` gives each
engine its identity.
"""
