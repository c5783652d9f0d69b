"""The record of a message before its ack, written on the event loop, several at a time (group commit).

Each message Slack sends is kept in the inbox before the bot acks it (bot.handlers). Written through the
threaded engine, a record cost a hop to a thread and back and a transaction (a commit, so a flush of the
database's log) of its own. Here it is written on the event loop, through chatops.inbox_async (async
connections, one pool for the process), by a writer that takes every message waiting and keeps them in one
transaction: while one batch commits, the messages that arrive wait for the next, so a burst costs few
commits and an event alone waits for nobody. Each waiter is answered once the commit of its batch has
succeeded, never before.

A batch that fails before its commit (one bad message, another bot that created the same session meanwhile) is
rolled back and its messages are written again one by one, each in a transaction of its own, so that one
message's failure is that message's alone and none is lost or answered for another.

The bounds of bot.before_ack hold: a waiter gets its answer within DEADLINE_S. A message given up before its
batch began its commit (`abandon`) is never committed: the batch is rolled back and written again without it,
and its waiter raises DatabaseSilent. A waiter whose deadline comes during its batch's commit cannot know:
Unsure, with the outcome to come. The connections' waits are bounded (chatops.db's `wait_s`) and a batch is
given BATCH_LIMIT_S in all, so that a database that falls silent holds a writer for that long at most.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from sqlalchemy.exc import IntegrityError

from bot.before_ack import DEADLINE_S, DatabaseSilent, Unsure
from chatops.inbox import Recorded
from chatops.inbox_async import AsyncInbox, CommitUnknown

log = logging.getLogger("mm.bot")

# The most messages one transaction keeps (a burst larger than this takes several).
MOST = 64
# Writers at once: while one commits, another writes what arrived meanwhile.
WRITERS = 2
# A batch's time in all, past which its writer gives it up (its connection is dropped): more than DEADLINE_S,
# since its waiters have their own deadline and the outcome of a commit under way is worth waiting for.
BATCH_LIMIT_S = 2 * DEADLINE_S


class _Waiter:
    """One message waiting for its record: its parameters, its outcome, and where it stands (`open` until its
    batch begins its commit, then `committing`; `abandoned` when its waiter gave up first)."""

    __slots__ = ("future", "state", "values")

    def __init__(self, values: dict[str, Any], future: asyncio.Future[Recorded]) -> None:
        self.values = values
        self.future = future
        self.state = "open"

    def settle(self, result: Recorded | None = None, error: BaseException | None = None) -> None:
        if self.future.done():
            return
        if result is not None:
            self.future.set_result(result)
        else:
            self.future.set_exception(error or DatabaseSilent())


def lock_order(waiter: _Waiter) -> tuple[str, str, str]:
    """Where a message's record takes its locks: its thread's session, then its own key (channel, thread, ts)."""
    values = waiter.values
    return (str(values["p_channel"]), str(values["p_thread"]), str(values["p_message_ts"]))


class InboxWriter:
    """Writes messages on the event loop, those waiting together: `await write(values)` is the message's
    Recorded once committed (values: chatops.inbox.message_values)."""

    def __init__(self, inbox: AsyncInbox, *, most: int = MOST, writers: int = WRITERS) -> None:
        self.inbox = inbox
        self._most = most
        self._writers = writers
        self._waiting: deque[_Waiter] = deque()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers_running = 0
        self._closed = False

    async def write(self, values: dict[str, Any]) -> Recorded:
        """keep(values), committed, within DEADLINE_S: DatabaseSilent when the deadline came before its commit
        began (it never will), Unsure when it came, or the database failed, during the commit; any other error
        as raised (nothing kept)."""
        if self._closed:
            raise DatabaseSilent
        waiter = _Waiter(values, asyncio.get_running_loop().create_future())
        # An outcome nobody waits for any more (a waiter that gave up) is not an error to report at exit.
        waiter.future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._waiting.append(waiter)
        self._start()
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.future), DEADLINE_S)
        except TimeoutError:
            if waiter.state == "open":
                waiter.state = "abandoned"  # taken out of its batch before the commit, or never taken
                raise DatabaseSilent from None
            raise Unsure(waiter.future) from None
        except Exception:
            if waiter.state == "committing":
                raise Unsure(None) from None
            raise

    async def session_of(self, channel_id: str, thread_ts: str) -> str | None:
        """The thread's session, or None, within DEADLINE_S (then DatabaseSilent): a read before the ack."""
        if self._closed:
            raise DatabaseSilent
        task = self._spawn(self.inbox.session_of(channel_id, thread_ts))
        # Not wait_for alone: it would wait for the read's cancellation, which a silent database never ends.
        done, _ = await asyncio.wait({task}, timeout=DEADLINE_S)
        if not done:
            task.cancel()
            raise DatabaseSilent
        return task.result()

    async def close(self) -> None:
        """At shutdown: no more records; the writers are stopped, and the pool's connections closed."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for waiter in self._waiting:
            waiter.settle(error=DatabaseSilent())
        self._waiting.clear()
        # Not waited for: a task stuck on a silent database may never end its cancellation.
        await self.inbox.close()

    # --- the writers ------------------------------------------------------------------------------------------

    def _spawn(self, work: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # A task given up on (a silent database) may end in an error nobody reads: not one to report at exit.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    def _start(self) -> None:
        if self._writers_running < self._writers:
            self._writers_running += 1
            self._spawn(self._drain())

    async def _drain(self) -> None:
        """Batch after batch, until nothing waits; a batch that takes longer than BATCH_LIMIT_S is left to itself
        (its connection stays with it) and its waiters are answered DatabaseSilent."""
        try:
            while batch := self._take():
                task = self._spawn(self._batch(batch))
                done, _ = await asyncio.wait({task}, timeout=BATCH_LIMIT_S)
                if not done:
                    task.cancel()
                    log.warning("the database did not answer %d record(s) within %.0f s", len(batch), BATCH_LIMIT_S)
                    for waiter in batch:
                        waiter.settle(error=DatabaseSilent())
                elif (error := task.exception()) is not None:  # not a database error: a bug; the waiters get it
                    for waiter in batch:
                        waiter.settle(error=error)
        finally:
            self._writers_running -= 1

    def _take(self) -> list[_Waiter]:
        batch: list[_Waiter] = []
        while self._waiting and len(batch) < self._most:
            waiter = self._waiting.popleft()
            if waiter.state == "open":
                batch.append(waiter)
        # In one order for every batch: two writers' transactions then take the rows' locks (a thread's session,
        # a message's unique key, which a mention and its `message` twin share) in the same order, and never wait
        # on each other in a cycle (a deadlock PostgreSQL breaks only after a second, failing a whole batch).
        batch.sort(key=lock_order)
        return batch

    async def _batch(self, batch: list[_Waiter], again: bool = True) -> None:
        """The batch kept and committed at once, each waiter answered once it is committed; on a failure that kept
        nothing, one by one (a message alone is tried again once after an IntegrityError: another bot created
        its session between our read and our insert)."""

        def committing() -> bool:
            # The point of no return: a waiter given up before it is never kept. No await between the check and
            # the marks: none can be given up in between.
            if any(w.state != "open" for w in batch):
                return False
            for waiter in batch:
                waiter.state = "committing"
            return True

        try:
            results = await self.inbox.keep([w.values for w in batch], committing)
        except CommitUnknown as exc:  # the commit itself failed: its outcome is unknown
            for waiter in batch:
                waiter.settle(error=exc)
            return
        except Exception as exc:  # noqa: BLE001 - whatever it is, nothing was kept: the waiters are told (or the batch split)
            for waiter in batch:
                if waiter.state == "committing":
                    waiter.state = "open"
            if len(batch) > 1:
                log.info("a batch of %d records failed (%s); writing them one by one", len(batch), type(exc).__name__)
                for waiter in batch:
                    if waiter.state == "open":
                        await self._batch([waiter])
            elif again and isinstance(exc, IntegrityError):
                await self._batch(batch, again=False)
            else:
                batch[0].settle(error=exc)
            return
        if results is None:
            # Given up meanwhile: never committed. The others go back to the front of the queue.
            self._waiting.extendleft(reversed([w for w in batch if w.state == "open"]))
            self._start()
            return
        for waiter, result in zip(batch, results, strict=True):
            waiter.settle(result)
