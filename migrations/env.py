"""Alembic's entry point: run by chatops.db.migrate (which passes a connection already in a transaction and
under the migration lock) or by the `alembic` command with a URL."""

from __future__ import annotations

from typing import Literal

from alembic import context
from sqlalchemy import Connection

from chatops.schema import Base, UTCDateTime

config = context.config
target_metadata = Base.metadata


def _render_item(kind: str, obj: object, autogen_context: object) -> str | Literal[False]:
    # Migrations spell the portable type, never the model's decorator: they must not import the models.
    if kind == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _configure(*, url: str | None = None, connection: Connection | None = None, literal_binds: bool = False) -> None:
    dialect = connection.dialect.name if connection is not None else str(url).split(":")[0]
    context.configure(
        url=url,
        connection=connection,
        literal_binds=literal_binds,
        target_metadata=target_metadata,
        compare_type=True,
        render_item=_render_item,
        # SQLite alters a table by copying it; the naming convention gives the copies stable constraint names.
        render_as_batch=dialect.startswith("sqlite"),
    )


def run_offline() -> None:
    _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    from chatops.db import engine_for

    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("alembic: no connection was passed and sqlalchemy.url is not set")
    engine = engine_for(url, foreign_keys=False)
    try:
        with engine.connect() as connection, connection.begin():
            _configure(connection=connection)
            context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
