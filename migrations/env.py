"""Alembic's entry point: run by chatops.db.migrate (which passes a connection already in a transaction and
under the migration lock) or by the `alembic` command with a URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from chatops.schema import Base, UTCDateTime

config = context.config
target_metadata = Base.metadata


def _render_item(kind: str, obj: object, autogen_context: object) -> str | bool:
    # Migrations spell the portable type, never the model's decorator: they must not import the models.
    if kind == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _configure(**kwargs: object) -> None:
    url = kwargs.pop("url", None)
    connection = kwargs.get("connection")
    dialect = connection.dialect.name if isinstance(connection, Connection) else str(url).split(":")[0]
    context.configure(
        url=url,
        target_metadata=target_metadata,
        compare_type=True,
        render_item=_render_item,
        # SQLite alters a table by copying it; the naming convention gives the copies stable constraint names.
        render_as_batch=dialect.startswith("sqlite"),
        **kwargs,
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

    engine = engine_for(config.get_main_option("sqlalchemy.url"), foreign_keys=False)
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
