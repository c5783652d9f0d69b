"""What the benchmarks share: a scratch PostgreSQL database, and readings of /proc (processes by name, the
machine's busy time). Not a benchmark itself (`make bench` runs bench/bench_*.py)."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@contextlib.contextmanager
def bench_database() -> Iterator[str]:
    """A migrated database of the run's own on the local PostgreSQL (MM_BENCH_POSTGRES_URL: another server's
    admin URL), dropped afterwards; its SQLAlchemy URL."""
    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    from chatops import db

    admin = os.environ.get("MM_BENCH_POSTGRES_URL") or DEFAULT_ADMIN_URL
    name = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_url(admin).set(drivername="postgresql+psycopg", database=name).render_as_string(hide_password=False)
    try:
        db.migrate(url)
        yield url
    finally:
        with contextlib.suppress(psycopg.Error):
            print(sequential_scans(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)))
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def sequential_scans(libpq_url: str) -> str:
    """The rows the server read by sequential scans, a table: a statement whose plan scans a table it should
    look up by key shows here as a count that grows with the run."""
    import psycopg

    with psycopg.connect(libpq_url, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT relname, seq_scan, seq_tup_read FROM pg_stat_user_tables WHERE seq_tup_read > 0 "
            "ORDER BY seq_tup_read DESC LIMIT 6"
        ).fetchall()
    said = ", ".join(f"{name} {reads:,} rows in {scans:,} scans" for name, scans, reads in rows)
    return f"rows read by sequential scans: {said or 'none'}"


def named(comm: str) -> list[int]:
    """The processes whose name is `comm` (the server's, say: `postgres`)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == comm:
                    pids.append(int(entry.name))
    return pids


def machine_jiffies() -> tuple[int, int]:
    """(busy, all) jiffies of all cores since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)
