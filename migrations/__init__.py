"""Alembic migrations for the chatops schema; run them with `mm-bot migrate` (chatops.db.migrate)."""
