"""A turn's events, rendered live into its Slack thread.

The agent hands events over through `emit`, which only queues them: Slack's latency and rate limits must
never slow the turn. One consumer task drains the queue in order and writes the thread:

- Status: the assistant status (`assistant.threads.setStatus`) in an assistant thread, else one status
  message that is edited and deleted at the end.
- TextDelta: the answer, streamed (chat.startStream / appendStream / stopStream) where Slack can stream to
  this thread — a DM, or a channel thread with its recipient named —, else posted and edited with chat.update.
  Text an asked agent writes goes into messages of its own, prefixed with its name. An answer longer than a
  message goes on in the next, cut between blocks (slackio/long_text.py): a code block is cut only when it
  cannot fit in one message, and then its fence is closed and reopened, with its language, in the next. A
  stream cannot take back what it showed: past a quarter of a message it shows only whole blocks.
- ToolCallStarted / ToolCallFinished: one message per call, mm_core.display's line (`🛠️ bash: ls`) with the
  result lines in a code block. A call that returns within HOLD is posted once, with its result; a longer one
  is posted at once and edited when it returns. Output longer than its preview is uploaded as a file (but
  not what read_file or read_skill return: a copy of the repository's own file or of a skill), and a line
  under the preview says how much it leaves out and where the whole is (or that the upload failed).
- ApprovalAsked (the worker's, once the calls a turn waits for are recorded): one message per call, with its
  buttons (slackio/approval_message.py); a text too long for it goes up first, whole, as a file (without that
  file the message offers no Approve); the bot updates it once someone decides.
- Error, and CallsDropped (an answer's calls beyond the cap): its line as a plain message (a notice longer than
  a message, a job's summary too, goes on in the next, cut as an answer is). TurnFinished: the recap line
  (counters and tokens), with the worker's `recap_note` under it (the use against the budgets).

Order: messages are created in the order of the events (a message is only created once everything before it
exists); only edits of existing messages are deferred. Rate: every message, and the status, is written at most
once a second (INTERVAL), however many deltas arrive: they batch. Safety: everything posted is scrubbed of the
worker's secrets, and `<!channel>`, `<!here>`, `<!everyone>`, `<!subteam^…>` (and bare `@here`…) written by
the model or a tool never notify anyone. Failures: slack_sdk retries 429s (Retry-After), 5xx and dropped
connections (slackio/slack_client.py); what still fails goes to `on_error(where, message)` and rendering goes
on — text that did not get through is sent again with the next write, so the answer is not lost.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import ClientError
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from chatops.buttons import Action, ButtonValue, element
from chatops.secrets import describe_error, scrub
from chatops.store import ApprovalRow
from mm_core import (
    CallsDropped,
    Error,
    Event,
    NetworkUsed,
    Outcome,
    PermissionRequested,
    Status,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnFinished,
    display,
)
from slackio.approval_message import ApprovalAsked, approval_blocks, file_name, file_title, layout
from slackio.blocks import (
    clip,
    code_sections,
    context_block,
    section_block,
)
from slackio.long_text import cut, pieces, reopening, showable
from slackio.mrkdwn import Mrkdwn, mrkdwn_of, quiet_markdown
from slackio.slack_out import SlackOut

log = logging.getLogger("mm.worker.render")

# Tools whose whole output is a copy of something the team already has (a file of the repository, a skill):
# the preview shows which, and a file upload of it would be three more Slack calls for nothing new.
COPIES = frozenset({"read_file", "read_skill"})
# Seconds between two writes to one message (an edit, an append) or to the status: Slack's own pace for edits.
INTERVAL = 1.0
# A tool call that returns within this is posted once, line and result together, rather than posted and edited.
HOLD = 1.0
# Slack's limits, kept well under: 50 blocks a message, 3,000 characters a section, 4,000 characters of text
# for chat.update, 12,000 characters of markdown_text a call.
MAX_BLOCKS = 50
# What a failed upload is reported as when no method says otherwise (slack_sdk's helper, which calls
# files.getUploadURLExternal, POSTs to the URL it answers, then calls files.completeUploadExternal).
UPLOAD = "files_upload_v2"
TEXT_CHARS = 3900
MARKDOWN_CHARS = 11000
LINE_CHARS = 1000
# At the end, how many rounds of writes to try before giving up on Slack.
FINISH_ROUNDS = 5
# Text on its way that cannot be shown yet: at least one whole mention, or one whole secret, may hide in it.
MIN_HOLDBACK = 16


@dataclass
class _Text:
    """A run of streamed text from one agent, shown in one message (or several, when it outgrows one)."""

    agent: str | None
    raw: str = ""
    ended: bool = False
    dirty: bool = False  # raw grew, or it ended, since the last write
    ts: str | None = None  # the message now being written
    streaming: bool = False  # ...as a chat stream
    start: int = 0  # where that message starts in the rendered text
    sent: int = 0  # how much of the rendered text it shows
    reopen: str = ""  # what it shows before rendered[start:]: the fence of a code block cut at its start
    last_write: float = -math.inf


@dataclass
class _Tool:
    started: ToolCallStarted | None
    at: float
    ts: str | None = None
    finished: ToolCallFinished | None = None
    last_write: float = -math.inf
    unfiled: bool = False  # its output was to go up as a file, and did not get there


@dataclass
class _Notice:
    text: str
    done: asyncio.Future[None]


_CLOSE = object()


@dataclass
class _StatusState:
    want: str = ""  # what the agent is doing now, as shown ("" for nothing)
    shown: str | None = ""  # what Slack shows, as far as we know (a reply clears an assistant status); None: unsure
    sent: str = ""  # what we last set
    ts: str | None = None  # the status message, outside assistant threads
    last_write: float = -math.inf


class ThreadRenderer:
    """Renders one turn (or a few, in order) into the thread `thread_ts` of `channel`.

    preview_lines: the result lines a call shows at most (the agent's previewLines). secrets: values never to
    be posted (chatops.secrets.secrets_of). assistant_thread: the thread is an assistant thread, where Slack
    offers assistant.threads.setStatus. recipient_user / recipient_team: whom a stream in a channel thread is
    for (Slack requires them outside DMs; without them the answer is posted and edited). on_error(where,
    message): told of each Slack failure that survived the retries. Call `aclose()` before the loop ends.
    """

    def __init__(
        self,
        client: AsyncWebClient,
        channel: str,
        thread_ts: str,
        *,
        preview_lines: int,
        secrets: Iterable[str] = (),
        assistant_thread: bool = False,
        recipient_user: str | None = None,
        recipient_team: str | None = None,
        on_error: Callable[[str, str], None] | None = None,
        session_id: str | None = None,
        on_approval_posted: Callable[[str, str], None] | None = None,
        on_approval_file: Callable[[str, str], None] | None = None,
        recap_note: Callable[[], str | None] | None = None,
    ) -> None:
        self.client, self.channel, self.thread_ts = client, channel, thread_ts
        self.preview_lines = preview_lines
        # Longest first, so that a secret containing another is masked whole (as chatops.secrets does).
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self.out = SlackOut(client, self.secrets)  # every write to the thread leaves through it
        self.assistant_thread = assistant_thread
        self.recipient_user, self.recipient_team = recipient_user, recipient_team
        self.on_error = on_error
        self.session_id, self.on_approval_posted = session_id, on_approval_posted
        self.on_approval_file = on_approval_file
        self.recap_note = recap_note  # a line under the recap (the turn's use against its budgets), asked at its end
        # Slack streams to one person: in a DM that is clear, in a channel the recipient must be named.
        self._can_stream = channel.startswith("D") or bool(recipient_user and recipient_team)
        self._holdback = max([MIN_HOLDBACK, *(len(s) for s in self.secrets)])
        self._inbox: collections.deque[Any] = collections.deque()
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._texts: list[_Text] = []  # runs of text with writes still to make, oldest first
        self._answer: _Text | None = None  # the main agent's text since its last tool call
        self._held: _Tool | None = None  # a call started and not posted yet
        self._tools: dict[str, _Tool] = {}  # posted calls that have not returned
        self._updates: list[_Tool] = []  # returned calls whose message waits for its edit
        self._lines: dict[str, display.CallLine] = {}  # call lines by call id, for results without a start
        self._status = _StatusState()

    # -- the API ------------------------------------------------------------------------------------------

    def emit(self, event: Event | ApprovalAsked) -> None:
        """The agent's Emit: queue the event and return at once."""
        if self._closing:
            log.debug("event after aclose dropped: %s", type(event).__name__)
            return
        self._inbox.append(event)
        self._wake_up()

    async def notice(self, text: str) -> None:
        """A plain line in the thread (queued, resumed, an error as a sentence), in order with the events."""
        if self._closing:
            with self._guard("notice"):
                await self._post_text(text)
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inbox.append(_Notice(text, done))
        self._wake_up()
        await done

    async def aclose(self) -> None:
        """Write everything still waiting (the answer's end, the recap) and clear the status. Never raises."""
        if self._closing and self._task is None:
            return
        self._closing = True
        self._inbox.append(_CLOSE)
        self._wake_up()
        task = self._task
        self._task = None
        if task is not None:
            with self._guard("render"):
                await task

    # -- the consumer -------------------------------------------------------------------------------------

    def _wake_up(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self._loop is None:
            if running is None:
                return  # nothing runs yet: the consumer starts with the first call made from the loop
            self._loop = running
            self._task = running.create_task(self._run(), name=f"render {self.channel}/{self.thread_ts}")
        if running is self._loop:
            self._wake.set()
        else:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def _run(self) -> None:
        while True:
            while self._inbox:
                item = self._inbox.popleft()
                if item is _CLOSE:
                    with self._guard("render"):
                        await self._finish()
                    return
                if isinstance(item, _Notice):
                    with self._guard("notice"):
                        await self._end_text()
                        await self._post_held()
                        await self._post_text(item.text)
                    if not item.done.done():
                        item.done.set_result(None)
                    continue
                with self._guard("render"):
                    await self._handle(item)
            with self._guard("render"):
                await self._flush_due()
            self._wake.clear()
            if self._inbox:
                continue
            due = self._next_due()
            timeout = None if due is None else max(0.0, due - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _handle(self, event: object) -> None:
        if isinstance(event, Status):
            # Posting a reply takes an assistant status down: what was to be posted before this status is
            # posted first, so that it does not take this one down.
            await self._post_held()
            current = self._texts[-1] if self._texts and not self._texts[-1].ended else None
            if current is not None and current.ts is None and current.last_write + INTERVAL <= time.monotonic():
                await self._write_text(current)
            self._set_status(event)
        elif isinstance(event, TextDelta):
            await self._post_held()
            text = self._texts[-1] if self._texts and not self._texts[-1].ended else None
            if text is not None and text.agent != event.agent:
                await self._end_text()
                text = None
            if text is None:
                text = _Text(event.agent)
                self._texts.append(text)
                if event.agent is None:
                    self._answer = text
            text.raw += event.text
            text.dirty = True
        elif isinstance(event, ToolCallStarted):
            await self._end_text()
            await self._post_held()
            if event.agent is None:
                self._answer = None
            self._lines[event.call_id] = display.call_line(event)
            self._held = _Tool(event, time.monotonic())
        elif isinstance(event, ToolCallFinished):
            await self._end_text()
            await self._finished(event)
        elif isinstance(event, PermissionRequested):
            for call in event.calls:
                self._lines[call.call_id] = display.call_line(call)
        elif isinstance(event, ApprovalAsked):
            await self._end_text()
            await self._post_held()
            await self._ask(event)
        elif isinstance(event, Error):
            await self._end_text()
            await self._post_held()
            await self._post_text(self._prefix(event.agent) + display.error_line(event))
        elif isinstance(event, NetworkUsed):  # one line for a command's refusals, none for what it reached
            if (line := display.network_line(event)) is not None:
                await self._end_text()
                await self._post_held()
                await self._post_text(self._prefix(event.agent) + line)
        elif isinstance(event, CallsDropped):  # one line for them all, never a message per dropped call
            await self._end_text()
            await self._post_held()
            await self._post_text(self._prefix(event.agent) + display.dropped_line(event))
        elif isinstance(event, TurnFinished):
            await self._end_text()
            await self._post_held()
            await self._turn_finished(event)
        # Anything else (events added to mm_core later) is not shown.

    def _next_due(self) -> float | None:
        dues = [t.last_write + INTERVAL for t in self._texts if t.dirty]
        dues += [t.last_write + INTERVAL for t in self._updates]
        if self._held is not None:
            dues.append(self._held.at + HOLD)
        if self._status_pending():
            dues.append(self._status.last_write + INTERVAL)
        return min(dues, default=None)

    async def _flush_due(self) -> None:
        """Every write whose time has come: held call lines, edits, appends, the status."""
        if self._held is not None and self._held.at + HOLD <= time.monotonic():
            await self._post_held()
        for text in list(self._texts):
            if text.dirty and text.last_write + INTERVAL <= time.monotonic():
                await self._write_text(text)
        for tool in list(self._updates):
            if tool.last_write + INTERVAL <= time.monotonic():
                self._updates.remove(tool)
                await self._write_tool(tool)
        if self._status_pending() and self._status.last_write + INTERVAL <= time.monotonic():
            await self._write_status()
        self._texts = [t for t in self._texts if t.dirty or not t.ended]

    async def _finish(self) -> None:
        await self._end_text()
        await self._post_held()
        self._status.want = ""
        if self.assistant_thread and self._status.sent:
            self._status.shown = None  # Slack may have taken it down already; clear it in so many words
        for _ in range(FINISH_ROUNDS):
            due = self._next_due()
            if due is None:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            await self._flush_due()
        else:
            if self._next_due() is not None:
                self._report("render", "gave up on Slack: some of the turn's last writes did not get through")
        if self._status.ts is not None:
            await self._call("chat.delete", channel=self.channel, ts=self._status.ts)
            self._status.ts = None

    # -- text ---------------------------------------------------------------------------------------------

    async def _end_text(self) -> None:
        """End the current run of text. A run not posted yet is posted now: what follows must come after it."""
        if not self._texts or self._texts[-1].ended:
            return
        text = self._texts[-1]
        text.ended = text.dirty = True
        if text.ts is None:
            await self._write_text(text)
            self._texts = [t for t in self._texts if t.dirty or not t.ended]

    def _stable(self, raw: str, final: bool) -> str:
        """The text as it may be shown: scrubbed, quiet (no mention, no Slack link markup), and — unless it is
        final — without its last few characters, where a secret, a mention or a link may still be arriving. What
        this returns only ever grows as raw grows, so a stream can send just the difference: quiet_markdown
        decides each change from at most ten characters after it, fewer than are held back."""
        text = quiet_markdown(self._scrub(raw))
        return text if final else text[: max(0, len(text) - self._holdback)]

    async def _write_text(self, text: _Text) -> None:
        text.dirty = False
        rendered = self._stable(text.raw, text.ended)
        # A message holds MARKDOWN_CHARS at most: a longer run goes on in another message, cut between blocks (a
        # code block too long for one is closed and reopened: slackio/long_text.py). A stream cannot take back
        # what it showed: it is cut no earlier, and it shows only what leaves a good cut possible.
        while len(rendered) - text.start > self._room(text):
            floor = text.sent if text.streaming else text.start
            c = cut(rendered, text.start, self._room(text), floor)
            if not await self._text_message(text, rendered, c.at, final=True, close=c.close):
                return
            text.ts, text.streaming, text.start, text.sent, text.reopen = None, False, c.at, c.at, c.reopen
        upto = len(rendered) if text.ended else showable(rendered, text.start, self._room(text))
        if upto > text.sent or (text.ended and text.streaming):  # a stream must also be stopped
            await self._text_message(text, rendered, upto, final=text.ended)

    def _room(self, text: _Text) -> int:
        """What the current message of a run has for its text: MARKDOWN_CHARS less its lead."""
        return MARKDOWN_CHARS - len(self._prefix(text.agent)) - 1 - len(text.reopen)

    def _lead(self, text: _Text, body: str) -> str:
        """A message's start: an asked agent's name, on a line of its own when a code fence follows (a fence
        opens a block only at the start of a line), and a code block's fence again when the block was cut."""
        body = text.reopen + body
        prefix = self._prefix(text.agent)
        if prefix and body.startswith(("`", "~")):
            prefix = prefix.rstrip() + "\n"
        return prefix + body

    async def _text_message(self, text: _Text, rendered: str, upto: int, *, final: bool, close: str = "") -> bool:
        """Make the current message show rendered[start:upto] (and end it, if final, with `close`: the fence of
        a code block cut there); False if Slack failed."""
        body = rendered[text.start : upto]
        now = time.monotonic()
        if text.ts is None:
            if not body.strip():
                return True
            markdown = self._lead(text, body)
            ts = None
            if self._can_stream and not final:
                ts = await self._start_stream(markdown)
                text.streaming = ts is not None
            if ts is None:
                ts = _ts(await self._call("chat.postMessage", **self._where(), markdown_text=markdown + close))
            text.last_write = now
            if ts is None:
                text.dirty = True  # try again at the next write
                return False
            text.ts, text.sent = ts, upto
            self._posted()
            return True
        if text.streaming:
            delta = rendered[text.sent : upto]
            if final:
                extra = {"markdown_text": delta + close} if delta + close else {}
                ok = await self._call("chat.stopStream", channel=self.channel, ts=text.ts, **extra)
            else:
                ok = await self._call("chat.appendStream", channel=self.channel, ts=text.ts, markdown_text=delta)
        else:
            markdown = self._lead(text, body) + close
            ok = await self._call("chat.update", channel=self.channel, ts=text.ts, markdown_text=markdown)
        text.last_write = now
        if ok is None:
            # That message will not take more: what it does not show goes on in a new one.
            text.ts, text.streaming, text.start = None, False, text.sent
            text.reopen = reopening(rendered, text.sent)
            text.dirty = True
            return False
        text.sent = upto
        return True

    async def _start_stream(self, markdown: str) -> str | None:
        params: dict[str, Any] = {"channel": self.channel, "thread_ts": self.thread_ts, "markdown_text": markdown}
        if self.recipient_user and self.recipient_team:
            params |= {"recipient_user_id": self.recipient_user, "recipient_team_id": self.recipient_team}
        try:
            response = await self.out.call("chat.startStream", **params)
        except (SlackApiError, SlackClientError) as e:
            # Streaming is not offered here (the plan, the app's features, an older Slack): post and edit.
            log.info("chat.startStream refused (%s): editing messages instead", self._scrub(_describe(e)))
            self._can_stream = False
            return None
        return _ts(response)

    # -- tool calls ---------------------------------------------------------------------------------------

    async def _post_held(self) -> None:
        held, self._held = self._held, None
        if held is None or held.started is None:
            return
        blocks, fallback, _ = self._tool_blocks(held)
        held.ts = await self._post_blocks(blocks, fallback)
        held.last_write = time.monotonic()
        self._tools[held.started.call_id] = held

    async def _finished(self, event: ToolCallFinished) -> None:
        if self._held is not None and self._held.started is not None and self._held.started.call_id == event.call_id:
            tool, self._held = self._held, None
        else:
            await self._post_held()
            tool = self._tools.pop(event.call_id, None) or _Tool(None, time.monotonic())
        tool.finished = event
        if tool.ts is None:
            blocks, fallback, long_output = self._tool_blocks(tool)
            tool.ts = await self._post_blocks(blocks, fallback)
        else:
            long_output = self._tool_blocks(tool)[2]
            self._updates.append(tool)  # the edit waits for its second
        if long_output:
            line = self._tool_line(tool)
            if await self._upload(event.output, _output_file(event), line.text) is None:
                # The preview said the whole output was in a file: it now says it is not.
                tool.unfiled = True
                if tool.ts is not None and tool not in self._updates:
                    self._updates.append(tool)

    async def _write_tool(self, tool: _Tool) -> None:
        blocks, fallback, _ = self._tool_blocks(tool)
        await self._call("chat.update", channel=self.channel, ts=tool.ts, text=fallback, blocks=blocks)
        tool.last_write = time.monotonic()

    def _tool_line(self, tool: _Tool) -> display.CallLine:
        if tool.started is not None:
            return display.call_line(tool.started)
        assert tool.finished is not None
        # A result without a start (a call rejected, cancelled or cut off before it ran): its line if we saw
        # it asked for, else just the tool's name.
        found = self._lines.get(tool.finished.call_id)
        return found or display.CallLine("•", tool.finished.tool, tool.finished.agent)

    def _tool_blocks(self, tool: _Tool) -> tuple[list[dict[str, Any]], str, bool]:
        """The call's message: its line, then its result lines in a code block, and when those are not the
        whole output a line that says so and where the whole is; and whether the output goes up as a file."""
        call = self._tool_line(tool)
        line = self._mrkdwn_line(call)
        blocks = [section_block(line)]
        if call.invisible:
            blocks.append(context_block(display.INVISIBLE_NOTE))
        event = tool.finished
        if event is None:
            return blocks, line, False
        shown = list(display.result_lines(event))[: max(self.preview_lines, 0)]
        code, clipped = self._code(shown)
        output, previewed = event.output.splitlines(), event.preview.splitlines()[: len(shown)]
        # The preview is the output's first lines (a tool may show something else: ask_agent's "answered").
        longer = self.preview_lines > 0 and output[: len(shown)] == previewed and len(output) > len(shown)
        filed = clipped or (longer and event.tool not in COPIES)
        if clipped or longer:
            code.append(context_block(_cut_note(event, len(output) - len(shown) if longer else 0, filed, tool.unfiled)))
        if (denied := display.denied_line(event)) is not None:
            code.append(context_block(denied))
        return blocks + code, line, filed

    # -- permission prompts -------------------------------------------------------------------------------

    async def _ask(self, asked: ApprovalAsked) -> None:
        """One message per waiting call: its line, its whole text (or its head and tail), who asked, until when,
        and the buttons. A text too long for the message goes up whole as a file first (on_approval_file records
        it), so that Approve is offered only once it can be read."""
        for row in asked.rows:
            if row.text_file is None and not (shown := layout(row, self.secrets)).whole:
                file_id = await self._upload(shown.text, file_name(row), file_title(row))
                if file_id is not None:
                    row = replace(row, text_file=file_id)
                    if self.on_approval_file is not None:
                        self.on_approval_file(row.call_id, file_id)
            if row.message_ts is not None:
                # Asked again (a turn resumed after its worker died): the message is there, keep it current.
                await self.update_approval(row, asked.channel)
                continue
            blocks, fallback = approval_blocks(row, asked.channel, self.secrets)
            ts = await self._post_blocks(blocks, fallback)
            if ts is not None and self.on_approval_posted is not None:
                self.on_approval_posted(row.call_id, ts)

    async def update_approval(self, row: ApprovalRow, channel: str) -> None:
        """Show a decision (or an expiry) on the call's message, without its buttons."""
        if row.message_ts is None:
            return
        blocks, fallback = approval_blocks(row, channel, self.secrets)
        with self._guard("approval"):
            await self._call("chat.update", channel=self.channel, ts=row.message_ts, text=fallback, blocks=blocks)

    # -- the turn's end -----------------------------------------------------------------------------------

    async def _turn_finished(self, event: TurnFinished) -> None:
        # The answer is normally what streamed; when it did not (a turn ended from the log after a restart),
        # it is posted now, so that the thread always has it.
        answer = event.answer.strip()
        if event.outcome == Outcome.ANSWERED and answer:
            streamed = self._answer.raw.strip() if self._answer is not None else ""
            if streamed != answer:
                text = _Text(None, event.answer)
                self._texts.append(text)
                await self._end_text()
        self._answer = None
        self._status.want = ""
        recap = display.recap(event)
        note = self.recap_note() if recap and self.recap_note is not None else None
        if recap:
            text = self._mrkdwn(f"{recap}\n{note}" if note else recap)
            await self._post_blocks([context_block(text)], text)

    # -- the status ---------------------------------------------------------------------------------------

    def _set_status(self, event: Status) -> None:
        who = f" ({event.agent})" if event.agent else ""
        if self.assistant_thread:  # Slack shows it after the app's name: "mm is thinking…"
            self._status.want = f"is {event.text[:1].lower()}{event.text[1:]}…{who}"
        else:
            self._status.want = f"⏳ {event.text}…{who}"

    def _status_pending(self) -> bool:
        status = self._status
        if self.assistant_thread:
            return status.want != status.shown
        return bool(status.want) and status.want != status.shown

    async def _write_status(self) -> None:
        status = self._status
        status.last_write = time.monotonic()
        want = self._scrub(status.want)
        if self.assistant_thread:
            await self._call(
                "assistant.threads.setStatus", channel_id=self.channel, thread_ts=self.thread_ts, status=want
            )
            # A failure is reported and not retried: the next status will try again.
            status.shown = status.sent = status.want
            return
        text = Mrkdwn.of(want)
        # While the turn runs its status message carries the Stop button (the `stop` keyword does the same).
        blocks = [section_block(text)]
        if self.session_id is not None:
            stop = element(Action.STOP, ButtonValue(self.session_id))
            blocks.append({"type": "actions", "block_id": "status", "elements": [stop]})
        if status.ts is None:
            status.ts = _ts(await self._call("chat.postMessage", **self._where(), text=text, blocks=blocks))
        else:
            await self._call("chat.update", channel=self.channel, ts=status.ts, text=text, blocks=blocks)
        status.shown = status.want

    def _posted(self) -> None:
        # Slack takes an assistant status down when the app replies in the thread; it comes back with the
        # agent's next status.
        if self.assistant_thread:
            self._status.shown = self._status.want = ""

    # -- posting ------------------------------------------------------------------------------------------

    async def _post_text(self, text: str) -> None:
        # A notice longer than a message (a job's summary, an error's words) goes on in the next, cut as an answer.
        for piece in pieces(self._mrkdwn(text), TEXT_CHARS):
            await self._post_blocks([], Mrkdwn(piece))  # pieces of escaped text, and fences: still escaped

    async def _post_blocks(self, blocks: list[dict[str, Any]], fallback: str) -> str | None:
        """Post `blocks` (at most MAX_BLOCKS a message: more go on in further messages); the first one's ts."""
        first: str | None = None
        chunks = [blocks[i : i + MAX_BLOCKS] for i in range(0, len(blocks), MAX_BLOCKS)] or [[]]
        for chunk in chunks:
            extra: dict[str, Any] = {"blocks": chunk} if chunk else {}
            ts = _ts(await self._call("chat.postMessage", **self._where(), text=clip(fallback, TEXT_CHARS), **extra))
            if ts is not None:
                self._posted()
            first = first or ts
        return first

    async def _upload(self, content: str, filename: str, title: str) -> str | None:
        """Long output goes up as a file in the thread rather than as a wall of text; the file's id, or None when
        it did not get there."""

        upload = self.out.upload(self.channel, self.thread_ts, content, filename, clip(self._scrub(title), 250))
        data = await self._run_call(UPLOAD, upload)
        if data is None:
            return None
        self._posted()
        return _file_id(data)

    async def _call(self, method: str, **params: Any) -> dict[str, Any] | None:
        """A Web API call; its answer, or None when it failed (reported through on_error)."""
        return await self._run_call(method, self.out.call(method, **params))

    async def _run_call(self, method: str, call: Awaitable[Any]) -> dict[str, Any] | None:
        try:
            response = await call
        except (SlackApiError, SlackClientError, ClientError, OSError, TimeoutError) as e:
            method = _failed_method(e) or method
            self._report(f"slack:{method}", f"{method}: {_describe(e)}")
            return None
        data = response if isinstance(response, dict) else getattr(response, "data", None)
        return data if isinstance(data, dict) else {}

    def _where(self) -> dict[str, str]:
        return {"channel": self.channel, "thread_ts": self.thread_ts}

    # -- texts --------------------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        return scrub(text, self.secrets)

    def _mrkdwn(self, text: str) -> Mrkdwn:
        return mrkdwn_of(text, self.secrets)

    def _prefix(self, agent: str | None) -> str:
        # An asked agent's lines carry its name, as in the terminal: `reviewer · …`.
        return f"{agent} · " if agent else ""

    def _mrkdwn_line(self, line: display.CallLine) -> Mrkdwn:
        return clip(self._mrkdwn(self._prefix(line.agent) + line.text), LINE_CHARS)

    def _code(self, lines: Sequence[str]) -> tuple[list[dict[str, Any]], bool]:
        return code_sections(lines, self._mrkdwn)

    # -- failures -----------------------------------------------------------------------------------------

    def _report(self, where: str, message: str) -> None:
        message = self._scrub(message)
        log.warning("%s: %s", where, message)
        if self.on_error is not None:
            try:
                self.on_error(where, message)
            except Exception:  # a broken reporter must not stop the rendering either
                log.exception("on_error failed")

    @contextlib.contextmanager
    def _guard(self, where: str) -> Iterator[None]:
        """Whatever goes wrong while rendering is reported, and the rendering goes on."""
        try:
            yield
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the turn must never be lost to its display
            log.exception("rendering failed")
            self._report(where, describe_error(e))


def _ts(data: dict[str, Any] | None) -> str | None:
    ts = data.get("ts") if data else None
    return ts if isinstance(ts, str) else None


def _file_id(data: dict[str, Any]) -> str | None:
    """The id of the file an upload answered with (files_upload_v2 names one `file`, or several `files`)."""
    file = data.get("file") or next(iter(data.get("files") or []), None)
    found = file.get("id") if isinstance(file, dict) else None
    return found if isinstance(found, str) and found else None


def _output_file(event: ToolCallFinished) -> str:
    return f"{event.tool}-output.txt"


def _cut_note(event: ToolCallFinished, more: int, filed: bool, unfiled: bool) -> str:
    """The line under a preview that is not the whole output: how much is left out, and where the whole is."""
    cut = f"✂️ {more:,} more line{'s' if more != 1 else ''} not shown" if more else "✂️ Cut to fit the message"
    if unfiled:
        return f"{cut}; the whole output could not be uploaded."
    if filed:
        return f"{cut}: the whole output is in {_output_file(event)}, the file below."
    return f"{cut}: the whole is what {event.tool} read, not uploaded again."


def _failed_method(e: BaseException) -> str | None:
    """The Web API method Slack refused, from the URL its answer came from: a helper's calls (files_upload_v2
    makes two) are reported under the one that failed."""
    if not isinstance(e, SlackApiError):
        return None
    url = str(getattr(e.response, "api_url", "") or "")
    method = url.rstrip("/").rpartition("/")[2]
    return method if re.fullmatch(r"[a-z]+(\.[a-zA-Z]+)+", method) else None


def _describe(e: BaseException) -> str:
    if isinstance(e, SlackApiError):
        data = e.response.data if isinstance(e.response.data, dict) else {}
        error = str(data.get("error") or f"HTTP {e.response.status_code}")
        details = (data.get("response_metadata") or {}).get("messages") or []
        status = f" (HTTP {e.response.status_code})" if e.response.status_code != 200 else ""
        return error + status + ("".join(f" {d}" for d in details) if details else "")
    return describe_error(e)
