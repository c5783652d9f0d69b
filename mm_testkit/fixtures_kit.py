"""Pytest fixtures of the test kit (loaded from tests/conftest.py's pytest_plugins).

- `model_server`: a started ModelServer with an empty script.
- `slack`: a started SlackEmulator (`slack.url`, `slack.bot_token`, bot user `slack.bot_user_id` seeded).
- `slack_sender`: a factory `slack_sender(url, signing_secret, **kwargs) -> SlackEventSender` whose envelopes
  and response_urls match the `slack` emulator.

Starting a server takes about a millisecond, so each test gets fresh ones: no state leaks between tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mm_testkit.model_server import ModelServer
from mm_testkit.slack_client import SlackEventSender
from mm_testkit.slack_emulator import SlackEmulator


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    """A scripted OpenAI-compatible server; `model_server.url` is the base URL ending in /v1."""
    with ModelServer() as server:
        yield server


@pytest.fixture
def slack() -> Iterator[SlackEmulator]:
    """A Slack Web API emulator; use `slack_sdk.WebClient(token=slack.bot_token, base_url=slack.url)`."""
    with SlackEmulator() as emulator:
        yield emulator


@pytest.fixture
def slack_sender(slack: SlackEmulator) -> Iterator[Callable[..., SlackEventSender]]:
    """Factory of signed-request senders to a bot: `slack_sender(bot_url, signing_secret, path=...)`."""
    made: list[SlackEventSender] = []

    def make(url: str, signing_secret: str, **kwargs: Any) -> SlackEventSender:
        defaults = {"team_id": slack.team_id, "api_app_id": slack.app_id, "bot_user_id": slack.bot_user_id,
                    "response_url": slack.response_url}
        sender = SlackEventSender(url, signing_secret, **(defaults | kwargs))
        made.append(sender)
        return sender

    yield make
    for sender in made:
        sender.close()
