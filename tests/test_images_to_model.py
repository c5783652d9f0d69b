"""Which shared images a model call carries (issue 22): a person's images are kept in the session log with their
message, and the request is built from the log on every call. Only a model whose config says `vision` gets
image parts, and only those of the latest message with images: a thread whose model changed to one without
images goes on, and a thread's requests do not grow by its images turn after turn."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from agent_support import agent_config, make_agent
from mm_core.agent import Agent
from mm_core.log import (
    AssistantMessage,
    Entry,
    MemoryStore,
    Outcome,
    TurnEnded,
    UserMessage,
    from_dict,
    to_dict,
)
from mm_core.state import IMAGE_LEFT_OUT, SessionState, image_type
from playground.model_server import Reply


def image(label: str, size: int = 64, mime: str = "image/png") -> str:
    """A data URL as workers.uploads keeps one: `size` bytes of image, told apart by `label`."""
    return f"data:{mime};base64," + base64.b64encode(label.encode().ljust(size, b"\0")).decode()


def left_out(n: int, mime: str = "image/png") -> str:
    return IMAGE_LEFT_OUT.format(n=n, mime=mime)


def image_urls(messages: list[dict[str, Any]]) -> list[str]:
    return [
        part["image_url"]["url"]
        for m in messages
        if isinstance(m["content"], list)
        for part in m["content"]
        if part["type"] == "image_url"
    ]


FIRST, SECOND, THIRD = image("first"), image("second", mime="image/jpeg"), image("third")
# Two turns that shared images (each ended), then one that shares none.
ONE = UserMessage(
    "what is this?\n[files: .mm/uploads/1.0/a.png (64 bytes), .mm/uploads/1.0/b.jpg (64 bytes)]",
    "U1",
    images=(FIRST, SECOND),
)
TWO = UserMessage("and this?\n[files: .mm/uploads/2.0/c.png (64 bytes)]", "U1", images=(THIRD,))
ENDED = TurnEnded(Outcome.ANSWERED)
THREAD: list[Entry] = [ONE, AssistantMessage("Two screenshots."), ENDED, TWO, AssistantMessage("A third."), ENDED]


def test_a_vision_model_gets_the_images_of_the_latest_message_with_images_only() -> None:
    sent = SessionState([*THREAD, UserMessage("compare them")]).messages("S", vision=True)
    assert image_urls(sent) == [THIRD]
    assert sent[1]["content"] == ONE.text + "\n" + left_out(1) + "\n" + left_out(2, "image/jpeg")
    assert sent[3] == {
        "role": "user",
        "content": [{"type": "text", "text": TWO.text}, {"type": "image_url", "image_url": {"url": THIRD}}],
    }
    assert sent[5]["content"] == "compare them"


def test_a_model_without_images_gets_a_line_for_each_image_instead() -> None:
    """The thread's model changed (`model=`, a config reload) to one that takes no images: no image part goes,
    so the model does not refuse every later request of the thread."""
    sent = SessionState([*THREAD, UserMessage("compare them")]).messages("S", vision=False)
    assert image_urls(sent) == []
    assert all(isinstance(m["content"], str) for m in sent)
    assert sent[1]["content"].endswith("\n" + left_out(1) + "\n" + left_out(2, "image/jpeg"))
    assert sent[3]["content"] == TWO.text + "\n" + left_out(1)
    assert left_out(1) == "[image 1 (image/png): not in this request; its file is in the files line]"


def test_a_request_does_not_grow_with_the_images_of_the_thread() -> None:
    """Ten turns that each shared a 1 MB image: the last request carries one image, not ten."""
    big = 1024 * 1024
    entries: list[Entry] = []
    for turn in range(10):
        entries += [UserMessage(f"shot {turn}", "U1", images=(image(str(turn), big),)), AssistantMessage("seen"), ENDED]
    state = SessionState(entries)
    request = json.dumps(state.messages("S", vision=True))
    assert image_urls(state.messages("S", vision=True)) == [image("9", big)]
    assert len(request) < 2 * len(image("9", big))
    assert len(json.dumps(state.messages("S", vision=False))) < 10_000


def test_the_images_shown_follow_the_log_as_it_grows_and_the_log_keeps_them_all() -> None:
    state = SessionState([ONE, THREAD[1]])
    assert image_urls(state.messages("S", vision=True)) == [FIRST, SECOND]
    state.append(ENDED)
    state.append(TWO)
    assert image_urls(state.messages("S", vision=True)) == [THIRD]
    # The log is not changed: every image is still there, and a stored message reads back the same.
    assert [e.images for e in state.entries if isinstance(e, UserMessage)] == [(FIRST, SECOND), (THIRD,)]
    assert from_dict(json.loads(json.dumps(to_dict(ONE)))) == ONE


def test_an_image_that_names_no_image_type_is_still_only_a_line() -> None:
    assert image_type("data:image/svg+xml;base64,AAAA") == "image/svg+xml"
    for odd in ["", "https://example.com/x.png", "data:text/html;base64,AAAA", "data:image/png\n;base64,AA"]:
        assert image_type(odd) == "image"
    sent = SessionState([UserMessage("look", images=("https://example.com/x.png",))]).messages("S")
    assert sent[1]["content"] == "look\n" + left_out(1, "image")


async def send(agent: Agent, text: str) -> str:
    try:
        return (await agent.send(text)).outcome
    finally:
        await agent.aclose()


def test_the_agent_sends_images_only_to_a_model_that_takes_them(model_server, tmp_path) -> None:
    """The turn loop asks with its own model's `vision`: the same log, sent on under a model with images and
    under one without."""
    for vision, urls in [(True, [THIRD]), (False, [])]:
        store = MemoryStore()
        for entry in THREAD:
            asyncio.run(store.append("s1", entry))
        model_server.script(Reply(text="ok"))
        config = agent_config(model_server.url, model={"url": model_server.url, "name": "m", "vision": vision})
        assert asyncio.run(send(make_agent(config, store, tmp_path), "compare them")) == "answered"
        assert image_urls(model_server.messages()) == urls
        assert [e.images for e in asyncio.run(store.load("s1")) if isinstance(e, UserMessage)] == [
            (FIRST, SECOND),
            (THIRD,),
            (),
        ]
