"""A CONNECT tunnel's bytes, both ways, untouched: the proxy has decided on the host and vetted its address, and
what passes afterwards (TLS, mostly) is the client's and the server's business.

Each direction ends on its own: an end-of-file from one side is passed on as a shut-down write to the other (a
client that sends its last request and then waits for the answer keeps working), and the tunnel ends when both
have ended, when either side fails, or when no byte has passed either way for `idle` seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from mm_core.network.h1 import CHUNK

log = logging.getLogger(__name__)

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, touch: Callable[[], None]) -> None:
    while data := await reader.read(CHUNK):
        touch()
        writer.write(data)
        await writer.drain()  # no more read from one side than the other side takes
        touch()
    if writer.can_write_eof():
        writer.write_eof()


async def splice(a: Stream, b: Stream, idle: float) -> None:
    """Copies a's bytes to b and b's to a until the tunnel ends (see the module's docstring). The caller closes
    both."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(idle) as deadline:

            def touch() -> None:
                deadline.reschedule(loop.time() + idle)

            # A TaskGroup: one direction failing ends the other.
            async with asyncio.TaskGroup() as group:
                group.create_task(_pump(a[0], b[1], touch))
                group.create_task(_pump(b[0], a[1], touch))
    except* OSError as ended:  # TimeoutError (idle) is one too
        log.debug("egress: a tunnel ends: %r", ended.exceptions[0])
