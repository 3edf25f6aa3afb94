"""Booster's datastore: PostgreSQL through SQLAlchemy, embedded (pgserver) or by URL."""
