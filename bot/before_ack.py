"""The bot's database work before it acks Slack, bounded in time.

Slack wants an ack within 3 seconds; the record before it is what makes the ack a promise, and a database that
is slow (a locked table) or silent (it accepts connections and never answers) must not hold a listener, a
thread, or the process's shutdown, past that. So that work:

- runs on threads of its own (`_threads`), never the default executor that the work after the ack uses: stuck
  threads there cannot delay an ack, nor stuck threads here the work after it;
- goes through an engine whose every wait is bounded (chatops.db.engine_for's `wait_s`: connecting, a
  connection from the pool, a statement or a lock on PostgreSQL, SQLite's busy timeout), WAIT_S;
- is given DEADLINE_S in all (`bounded`): a listener then answers Slack either way.

A record that ran out of time must not be kept behind the person's back once they were told it was not: the
record's commit asks `Commit.wanted` first, and a listener that gave up (`Commit.abandon`) before the commit
began makes it roll back; `recorded` then raises DatabaseSilent, and nothing is kept. A listener whose deadline
came while the commit was under way cannot know (Unsure): what it asked is carried out if the commit went
through, by this bot once the thread returns (Unsure.outcome), or by a replay.

A message's record does not take these threads: it is written on the event loop (bot.inbox_writer), under the
same deadline, the same bounded waits and the same answers (DatabaseSilent, Unsure).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from bot.errors import BotError

T = TypeVar("T")
log = logging.getLogger("mm.bot")

# Slack's ack is due within 3 s; what the bot does before it gets two, the rest is bolt's and the network's.
DEADLINE_S = 2.0
# One wait of the work before the ack (a connection, a statement, a lock), under DEADLINE_S so that a slow
# database's own error (a lock timeout), not the deadline, usually ends it: that error is certain.
WAIT_S = 1.5

# More than the default executor's few (cores + 4): a burst of records waits on the database, not on a thread.
_threads = ThreadPoolExecutor(max_workers=8, thread_name_prefix="mm-before-ack")


def release_threads() -> None:
    """At shutdown: the idle threads of the work before the ack end now, not at the interpreter's exit."""
    _threads.shutdown(wait=False, cancel_futures=True)


class DatabaseSilent(BotError):
    """The database did not answer within DEADLINE_S; nothing was kept."""


class Unsure(BotError):
    """The deadline came, or the database failed, while the record's commit was under way: it may be kept.
    `outcome`: the record's own result, once its thread returns (None when the commit failed)."""

    def __init__(self, outcome: asyncio.Future[Any] | None) -> None:
        super().__init__("the database did not answer while committing")
        self.outcome = outcome


async def bounded(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on the threads of the work before the ack, for at most DEADLINE_S (then DatabaseSilent)."""
    future = asyncio.get_running_loop().run_in_executor(_threads, functools.partial(fn, *args))
    try:
        return await asyncio.wait_for(future, DEADLINE_S)
    except TimeoutError:
        raise DatabaseSilent from None


class Commit:
    """A record's point of no return, decided once: by its thread, right before the commit (`wanted`), or by its
    listener at the deadline (`abandon`), whichever comes first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = "open"

    def wanted(self) -> bool:
        with self._lock:
            if self._state == "abandoned":
                log.info("a record was given up before its commit (its listener answered Slack without it)")
                return False
            self._state = "committing"
            return True

    def abandon(self) -> bool:
        """True when nothing will be committed (the thread had not begun its commit)."""
        with self._lock:
            if self._state == "open":
                self._state = "abandoned"
            return self._state == "abandoned"

    @property
    def committing(self) -> bool:
        with self._lock:
            return self._state == "committing"


def silent(error: BaseException) -> bool:
    """Whether `error` says the database did not answer in time (the deadline, a connection or a lock that
    timed out, a pool with none free), rather than that it refused what was asked."""
    return isinstance(error, DatabaseSilent | OperationalError | PoolTimeout)


async def recorded(keep: Callable[[Callable[[], bool]], T]) -> T:
    """keep(commit_if) on the threads of the work before the ack: its result within DEADLINE_S. DatabaseSilent
    when the deadline came before the commit (which then never happens); Unsure when it came, or the database
    failed, during the commit; any other error as raised (nothing kept)."""
    commit = Commit()
    future = asyncio.get_running_loop().run_in_executor(_threads, keep, commit.wanted)
    try:
        return await asyncio.wait_for(asyncio.shield(future), DEADLINE_S)
    except TimeoutError:
        if commit.abandon():
            future.cancel()  # not begun yet: it never will; begun: it rolls back at `wanted`
            raise DatabaseSilent from None
        raise Unsure(future) from None
    except Exception:
        if commit.committing:
            raise Unsure(None) from None
        raise
