"""The domain: run, job and container states, an attempt as data, and the pure rules
(outcomes, adoption, fallbacks, the workflow graph, tool JSON, limit bounds, webhook
fairness). No I/O and no infrastructure: an import-linter contract keeps it so.
"""
