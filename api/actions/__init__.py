"""What the JSON API's routes and the dashboard both do, apart from either: plain functions
of the services, the caller and parsed arguments that return read models or responses and
raise ``Problem``. Routes and dashboard views parse, call one, and present its answer."""
