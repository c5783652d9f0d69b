"""Figures for the database store (not a test): DbStore.append, fenced by a lease token, on PostgreSQL.

N appends of a turn's entry kinds in rotation (user message, assistant message with a call and its tokens, decision,
start, result, error, end), one session, one thread, the store metered as a worker's is (the answer's usage is a
row of model_usage: chatops/budgets.py); prints appends/s, this process's CPU per append (SQLAlchemy and psycopg,
not the server's) and the statements per append.

Run: .venv/bin/python bench/bench_store.py [appends, default 3000] [database URL, default a scratch PostgreSQL
database on 127.0.0.1 that is dropped afterwards]
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from typing import Any

from sqlalchemy import Engine, create_engine, event, text

from chatops import db, store
from mm_core.config import ModelPrice
from mm_core.log import (
    AssistantMessage,
    CallStatus,
    Decision,
    Entry,
    ErrorRecord,
    Outcome,
    ToolCallRequest,
    ToolResult,
    ToolStarted,
    TurnEnded,
    UserMessage,
)

ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
WARMUP = 200


def entries(n: int) -> list[Entry]:
    out: list[Entry] = []
    i = 0
    while len(out) < n:
        call = f"call-{i}"
        out += [
            UserMessage(f"message {i}", author="U01ALICE"),
            AssistantMessage(
                "Looking.",
                (ToolCallRequest(call, "bash", '{"command": "make"}'),),
                prompt_tokens=1200,
                completion_tokens=80,
            ),
            Decision(call, approved=True, by="U02BOB"),
            ToolStarted(call, "bash"),
            ToolResult(call, "bash", "ok\n" * 20, status=CallStatus.OK, duration_ms=42),
            ErrorRecord("the model stalled", where="generation"),
            TurnEnded(Outcome.ANSWERED),
        ]
        i += 1
    return out[:n]


def run(engine: Engine, n: int) -> None:
    session_id = store.ensure_session(engine, channel_id="CBENCH", thread_ts=f"{uuid.uuid4().int % 10**10}.1")
    token = store.acquire_lease(engine, session_id, "bench", ttl_s=3600)
    log = store.DbStore(engine, token, store.Metered("CBENCH", "big", ModelPrice(input=0.15, output=0.6)))
    work = entries(WARMUP + n)
    for entry in work[:WARMUP]:  # connections opened, statements compiled and cached
        asyncio.run(log.append(session_id, entry))

    cpu0, wall0 = time.process_time(), time.perf_counter()
    for entry in work[WARMUP:]:
        asyncio.run(log.append(session_id, entry))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0

    statements = 0  # counted on a second pass: a listener would slow the timed one down

    def count(*_: Any) -> None:
        nonlocal statements
        statements += 1

    event.listen(engine, "before_cursor_execute", count)
    for entry in work[WARMUP:]:
        asyncio.run(log.append(session_id, entry))
    event.remove(engine, "before_cursor_execute", count)
    assert len(asyncio.run(log.load(session_id))) == WARMUP + 2 * n
    print(f"{engine.dialect.name}: {n} appends in {wall:.2f} s: {n / wall:,.0f} appends/s")
    print(f"  CPU of this process: {cpu / n * 1e6:,.0f} µs per append")
    print(f"  statements sent: {statements / n:.2f} per append (BEGIN, COMMIT and the pool's pre-ping not counted)")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    if len(sys.argv) > 2:
        db.migrate(sys.argv[2])
        engine = db.engine_for(sys.argv[2])
        try:
            run(engine, n)
        finally:
            engine.dispose()
        return
    name = f"mm_bench_store_{os.getpid()}"
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        db.migrate(url)
        engine = db.engine_for(url)
        try:
            run(engine, n)
        finally:
            engine.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
