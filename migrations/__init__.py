"""Alembic migrations for Booster's PostgreSQL schema (``booster migrate`` runs them)."""
