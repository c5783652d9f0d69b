"""The buttons the bot posts and the bot receives: their action ids, labels and the value they carry.

The worker builds the blocks (an approval prompt, a Stop button) and the bot reads the clicks; both import
this module, so the two sides cannot drift apart. A click's value comes back from Slack as the button was
posted, but anyone who can sign a request can send any value, so decoding it is strict and its failure is
a sentence, never an exception out of a listener.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from chatops.errors import ChatopsError

# Slack keeps a button's value to 2,000 characters.
MAX_VALUE = 2000
_ID = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")


class Action(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"
    APPROVE_ALL = "approve_all"
    STOP = "stop"
    PUSH = "push"  # the thread's changes to a branch (workers/thread_push.py)
    PULL_REQUEST = "pull_request"  # the same, and the branch's pull request opened or updated


LABELS = {
    Action.APPROVE: "Approve",
    Action.REJECT: "Reject",
    Action.APPROVE_ALL: "Approve all in this thread",
    Action.STOP: "Stop",
    Action.PUSH: "Push branch",
    Action.PULL_REQUEST: "Open pull request",
}
STYLES = {Action.APPROVE: "primary", Action.REJECT: "danger", Action.STOP: "danger"}
# What bolt's action listener matches: every button of ours, and nothing else.
ACTION_PATTERN = re.compile(rf"\A({'|'.join(re.escape(a.value) for a in Action)})\Z")


class BadButton(ChatopsError, ValueError):
    """A click whose value is not one we posted: str() says what was wrong."""


@dataclass(frozen=True)
class ButtonValue:
    """What a click names: the session, and the tool call it decides (None for Stop, Push branch, Open pull
    request)."""

    session_id: str
    call_id: str | None = None

    def encode(self) -> str:
        data = {"s": self.session_id} | ({"c": self.call_id} if self.call_id else {})
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def decode(cls, text: object) -> ButtonValue:
        if not isinstance(text, str) or not text:
            raise BadButton("the button carries no value")
        if len(text) > MAX_VALUE:
            raise BadButton(f"the button's value is longer than Slack allows ({len(text)} > {MAX_VALUE} characters)")
        try:
            data = json.loads(text)
        except ValueError:
            raise BadButton("the button's value is not one the bot posted (not JSON)") from None
        if not isinstance(data, dict) or set(data) - {"s", "c"}:
            raise BadButton("the button's value is not one the bot posted (unexpected fields)")
        session_id, call_id = data.get("s"), data.get("c")
        if not isinstance(session_id, str) or not _is_id(session_id) or not (call_id is None or _is_id(call_id)):
            raise BadButton("the button's value does not name a session and a call")
        return cls(session_id, call_id)


def _is_id(value: object) -> bool:
    return isinstance(value, str) and bool(_ID.fullmatch(value))


def element(action: Action, value: ButtonValue, label: str | None = None) -> dict[str, Any]:
    """The Block Kit button for `action`, carrying `value`; `label` in place of the action's own."""
    button: dict[str, Any] = {
        "type": "button",
        "action_id": action.value,
        "text": {"type": "plain_text", "text": label or LABELS[action]},
        "value": value.encode(),
    }
    if action in STYLES:
        button["style"] = STYLES[action]
    return button
