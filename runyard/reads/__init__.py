"""Read models for the API and the dashboard: a run as shown, its events in delivery order,
the dashboard's pages and the worker pools."""
