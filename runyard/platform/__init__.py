"""The platform under every part: settings, the database and its errors, the ORM models,
connection roles, LISTEN/NOTIFY, logging, metrics and fault points."""
