"""Alembic revisions (this file makes them a package that ships; Alembic skips it)."""
