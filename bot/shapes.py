"""What the listeners read of a signed request, checked before they run, and text made fit to keep.

A signed request comes from Slack, but a field of another type or length than Slack sends (an `event` that is a
string, a `text` that is a number, a channel id longer than any, `actions` that is not a list) would make a
listener raise, or the database refuse the record: answered 500, retried by Slack to no end, and lost. So the
fields the listeners read are checked first (`problem`), by type and by the length the schema keeps; a request
whose shape does not fit is acked and dropped with one log line naming the field (never its content): no retry
could make it fit. Fields nobody reads are not checked.

Text is kept as written but for what no database keeps: NUL characters and lone surrogates (a `\\ud800` escape
in Slack's JSON) are taken out (`kept`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr, ValidationError

from chatops.buttons import MAX_VALUE
from chatops.schema import Session

# Slack's own bound on a message's text: an event's text is never longer, and a `/mm` text longer than a message
# could be is refused with a sentence (bot.handlers), not kept.
MAX_TEXT = 40_000
# What the schema keeps of Slack's ids and timestamps (a channel, a thread's ts, a person).
ID_LENGTH: int = getattr(Session.__table__.c.channel_id.type, "length", None) or 32

Id = Annotated[StrictStr, Field(max_length=ID_LENGTH)]


def _text(value: Any) -> Any:
    """A person's text: a string of at most MAX_TEXT, lone surrogates and all (`kept` takes them out)."""
    if not isinstance(value, str):
        raise ValueError("Input should be a valid string")
    if len(value) > MAX_TEXT:
        raise ValueError(f"String should have at most {MAX_TEXT} characters")
    return value


# Any, then checked: pydantic's own str refuses a lone surrogate, which Slack's JSON may hold in a person's text.
Text = Annotated[Any, AfterValidator(_text)]
Word = Annotated[StrictStr, Field(max_length=255)]

_UNKEPT = re.compile("[\x00\ud800-\udfff]")


def kept(text: str) -> str:
    """`text` without what a database cannot keep: NUL characters and lone surrogates (a pair that JSON escaped
    is one character already, and stays)."""
    return _UNKEPT.sub("", text)


class _Read(BaseModel):
    """The fields a listener reads, each of the type Slack sends (strict: a number is not a string); the others
    are let through unread."""

    model_config = ConfigDict(extra="allow", strict=True)


class _Thread(_Read):
    channel_id: Id | None = None
    thread_ts: Id | None = None
    user_id: Id | None = None
    context: dict[str, Any] | None = None


class _Event(_Read):
    type: Word
    text: Text | None = None
    user: Id | None = None
    channel: Id | None = None
    ts: Id | None = None
    thread_ts: Id | None = None
    event_ts: Id | None = None
    channel_type: Word | None = None
    subtype: Word | None = None
    bot_id: Word | None = None
    team: Id | None = None
    user_team: Id | None = None  # the author's own team (a Slack Connect person's), whom a stream names
    tab: Word | None = None
    assistant_thread: _Thread | None = None


class _EventCallback(_Read):
    event: dict[str, Any]
    event_id: Word | None = None
    team_id: Id | None = None


class _Ref(_Read):
    id: Id | None = None


class _Container(_Read):
    type: Word | None = None
    channel_id: Id | None = None
    thread_ts: Id | None = None
    message_ts: Id | None = None


class _Message(_Read):
    ts: Id | None = None
    thread_ts: Id | None = None


class _Action(_Read):
    action_id: Word | None = None
    value: Annotated[StrictStr, Field(max_length=MAX_VALUE)] | None = None
    action_ts: Id | None = None


class _Interaction(_Read):
    type: Word
    user: _Ref | None = None
    team: _Ref | None = None
    channel: _Ref | None = None
    container: _Container | None = None
    message: _Message | None = None
    actions: list[_Action] | None = None
    view: dict[str, Any] | None = None
    trigger_id: Word | None = None


class _SlashCommand(_Read):
    command: Word
    text: StrictStr | None = None  # its length is the listener's to refuse, in a sentence
    channel_id: Id
    user_id: Id
    team_id: Id | None = None
    trigger_id: Word | None = None
    response_url: Annotated[StrictStr, Field(max_length=2000)] | None = None


# The events the listeners take (bot.app.register); the others are acked unread.
_READ_EVENTS = frozenset(
    {"app_mention", "message", "app_home_opened", "assistant_thread_started", "assistant_thread_context_changed"}
)


def problem(body: dict[str, Any]) -> str | None:
    """Where a signed request's body does not have the shape the listeners read (a field's path and what was
    wrong, never its value); None when it fits."""
    try:
        if "command" in body:
            _SlashCommand.model_validate(body)
        elif body.get("type") == "event_callback":
            event = _EventCallback.model_validate(body).event
            if event.get("type") in _READ_EVENTS:
                try:
                    _Event.model_validate(event)
                except ValidationError as exc:
                    return _said(exc, "event.")
        elif "actions" in body or "view" in body or "trigger_id" in body:
            _Interaction.model_validate(body)
    except ValidationError as exc:
        return _said(exc)
    return None


def _said(error: ValidationError, prefix: str = "") -> str:
    first = error.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "the body"
    return f"{prefix}{where}: {first['msg']}"[:200]


# Slack shares at most 10 files in one message; more is not Slack's, and is not kept.
MAX_FILES = 10
# What the worker reads of a shared file (workers.uploads), each a string of at most this many characters but
# `size`; the rest of Slack's description (thumbnails, permalinks) is not kept.
_FILE_FIELDS = {"id": ID_LENGTH, "name": 255, "mimetype": 255, "url_private_download": 2000}


def shared_files(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The files a message carries (`files` of a `file_share` message, an app_mention or a reply), as the worker
    needs them to download them: a field of another type or longer than Slack sends is left out (the worker
    then says in the thread that the file could not be taken), never raised on: the message itself is kept."""
    files = event.get("files")
    if not isinstance(files, list):
        return []
    kept_files = []
    for file in files[:MAX_FILES]:
        if not isinstance(file, dict):
            continue
        one: dict[str, Any] = {
            name: kept(value)
            for name, most in _FILE_FIELDS.items()
            if isinstance(value := file.get(name), str) and len(value) <= most
        }
        size = file.get("size")
        if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
            one["size"] = size
        kept_files.append(one)
    return kept_files
