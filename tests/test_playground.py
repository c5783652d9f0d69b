"""The playground end to end, in headless Chromium (Debian's, driven by Playwright): the real `mm-bot`
process with its bot, its Celery worker and the Slack Web API emulator behind the page, and a model (the
project's scripted one on its OpenAI-compatible wire, or the demo model when none answers).

What a person does here is what they would do in Slack: pick who they are, type `@mm …` in the channel, reply in
the thread, click the buttons. Everything is read off the page, as they would read it.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright
from slack_sdk import WebClient

from chatops.buttons import LABELS, Action
from commands.dev import PLAYGROUND_INSTEAD
from commands.playground import (
    DEMO_REPO,
    FORGE_TOKEN_ENV,
    PEOPLE,
    PLAYGROUND,
    PLAYGROUND_DIR,
    WORKSPACES,
    run_playground,
)
from mm_testkit.fixtures_kit import needs_bwrap_when_root, needs_system
from mm_testkit.redis_server import OwnRedis
from mmbot_helpers import CONFIG_ENV, MM_BOT, clean_env, free_port, session_processes
from playground.demo_model import LABEL
from playground.model_server import ModelServer, Reply, ToolCall
from playground.server import MAX_FILE, ModelInfo, PlaygroundPage
from playground.slack_api import UNKNOWN_METHOD, SlackEmulator
from threads_support import reads_shared_files
from workers.turns import STOPPED

pytestmark = [needs_system("chromium", "chromium"), needs_bwrap_when_root]

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT = ROOT / "docs" / "playground.png"
# Set to write the screenshot the README shows into docs/ (a test run otherwise leaves the tree alone).
UPDATE_SCREENSHOT = "MM_UPDATE_SCREENSHOT"
# Chromium as root, with nothing reaching out of this machine (its background services would try).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ADA, GRACE, LINUS = (p.id for p in PEOPLE)
# A real 1x1 PNG: the page's thumbnail must load it.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
WAIT = 60_000  # ms: a worker's first turn imports the agent core and clones the repository


class Playground:
    """`mm-bot <command>` (playground, or dev without a Slack token) in a directory of its own."""

    def __init__(self, command: str, env: dict[str, str], config: str | None = None) -> None:
        # Where the sandbox's user can reach the workspaces (var/workspaces): pytest's tmp_path is root's alone,
        # and a root worker refuses a workspaces directory its commands could not reach.
        self.directory = directory = Path(tempfile.mkdtemp(prefix="mm-playground-"))
        os.chmod(directory, 0o711)
        if config is not None:
            (directory / "mm.yaml").write_text(config)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = directory / "playground.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [MM_BOT, command, "--port", str(self.port), *(["--no-browser"] if command == "playground" else [])],
                env=env,
                cwd=directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"mm-bot {command} exited early:\n{self.output()}")
            # The page is up first; this line says the bot behind it answers too.
            if f"open {self.base} in your browser" in self.output():
                assert httpx.get(f"{self.base}/api/state", params={"user": ADA}, timeout=5).status_code == 200
                return
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"the playground did not answer within 90s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)  # a terminal's Ctrl-C
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        assert session_processes(self.process.pid) == [], "the playground left processes behind"
        # Its emulator runs in that process: a call it did not know is in the log (the kit checks its own).
        unknown = [line for line in self.output().splitlines() if f"{UNKNOWN_METHOD}:" in line]
        assert not unknown, f"the playground's Slack emulator answered unknown_method: {unknown}"
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def model() -> Iterator[ModelServer]:
    with ModelServer(models=("test-model",)) as server:
        yield server


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # A Redis of the module's own: a worker on the shared one could take other tests' turns.
    server = OwnRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def playground(tmp_path_factory: pytest.TempPathFactory, model: ModelServer, broker: str) -> Iterator[Playground]:
    # A person's real app's OAuth client in the environment: the playground's bot must answer to the emulator's app.
    oauth = {"SLACK_CLIENT_ID": "1.2", "SLACK_CLIENT_SECRET": "their-own-app-s-secret"}
    env = clean_env(CELERY_BROKER_URL=broker, MM_MODEL_URL=model.url, MM_MODEL="test-model", **oauth)
    running = Playground("playground", env)
    yield running
    running.stop()


@pytest.fixture
def page(browser: Browser, playground: Playground, model: ModelServer) -> Iterator[Page]:
    model.reset()
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    opened = context.new_page()
    opened.goto(playground.base)
    yield opened
    context.close()
    assert model.errors == [], model.errors


# --- what a person does ------------------------------------------------------------------------------------


def be(page: Page, user: str) -> None:
    page.select_option("#user", user)


def mention(page: Page, text: str) -> Locator:
    """Post `@mm text` in the channel as the current person; the page opens its thread, which is returned."""
    page.fill("#composer", f"@mm {text}")
    page.press("#composer", "Enter")
    thread = page.locator("#thread")
    expect(thread).to_be_visible()
    expect(thread.locator(".message").first).to_contain_text(text)
    return thread


def reply(page: Page, text: str) -> None:
    page.fill("#thread-composer", text)
    page.press("#thread-composer", "Enter")


def click(thread: Locator, label: str, within: Locator | None = None) -> None:
    (within or thread).get_by_role("button", name=label, exact=True).last.click()


def approval(thread: Locator, waiting_for: str) -> Locator:
    """The approval message in the thread that shows `waiting_for` (a command, a path), found by its buttons and
    then held by its ts, since a decision takes the buttons away."""
    buttons = thread.page.get_by_role("button", name=LABELS[Action.APPROVE], exact=True)
    message = thread.locator(".message", has=buttons).filter(has_text=waiting_for)
    expect(message).to_have_count(1, timeout=WAIT)
    return thread.locator(f'.message[data-ts="{message.get_attribute("data-ts")}"]')


# --- the scripted model ------------------------------------------------------------------------------------


def test_a_mention_streams_its_answer_and_a_reply_without_mention_continues_the_thread(
    page: Page, model: ModelServer
) -> None:
    words = [f"word{i:02d}" for i in range(40)]
    answer = " ".join(words)
    # Four characters every 0.2 s: about ten seconds of streaming, far more than the worker's pace of updates.
    model.script(
        Reply(text=answer, chunk_size=4, interval=0.2),
        lambda request: Reply(text=f"You asked {_last_user_text(request)!r}; before, I said {words[-1]}."),
    )
    be(page, ADA)
    thread = mention(page, "what is in this repository?")
    expect(thread).to_contain_text(words[0], timeout=WAIT)
    assert words[-1] not in thread.inner_text()  # the first words are shown while the rest is still coming
    expect(thread).to_contain_text(answer, timeout=WAIT)

    reply(page, "and the tests?")
    expect(thread).to_contain_text(f"before, I said {words[-1]}", timeout=WAIT)
    second = model.messages(-1)
    assert [m["content"] for m in second if m["role"] == "assistant"] == [answer]
    assert "and the tests?" in _last_user_text({"messages": second})


def test_a_non_approver_is_refused_and_an_approver_approves_a_command_whose_output_shows(
    page: Page, model: ModelServer
) -> None:
    model.script(
        Reply(tool_calls=[ToolCall("bash", {"command": "echo approved-output-$((6 * 7))"})]),
        Reply(text="The command printed its line."),
    )
    be(page, ADA)
    thread = mention(page, "run the echo")
    prompt = approval(thread, "echo approved-output")

    be(page, LINUS)
    click(thread, "Approve", within=prompt)
    refusal = thread.locator(".ephemeral").filter(has_text="Only this channel's approvers may")
    expect(refusal).to_be_visible(timeout=WAIT)
    expect(refusal).to_contain_text("Only visible to you")
    be(page, ADA)  # an ephemeral is for its person only
    expect(thread.locator(".ephemeral").filter(has_text="Only this channel's approvers may")).to_have_count(0)
    expect(prompt.get_by_role("button", name="Approve", exact=True)).to_be_visible()  # nothing was decided

    be(page, GRACE)
    click(thread, "Approve", within=prompt)
    expect(thread).to_contain_text("approved-output-42", timeout=WAIT)
    expect(prompt).to_contain_text("Approved by @grace")
    expect(thread).to_contain_text("The command printed its line.", timeout=WAIT)


def test_the_stop_button_stops_a_running_turn(page: Page, model: ModelServer) -> None:
    model.script(Reply(text="I am thinking about it at length", chunk_size=4, stall_after=3, stall_for=120))
    be(page, ADA)
    thread = mention(page, "think hard")
    expect(thread).to_contain_text("Thinking", timeout=WAIT)  # the status message, which carries the button
    stop = thread.get_by_role("button", name="Stop", exact=True)
    expect(stop).to_be_visible(timeout=WAIT)
    stop.click()
    expect(thread).to_contain_text(STOPPED, timeout=WAIT)
    expect(thread.get_by_role("button", name="Stop", exact=True)).to_have_count(0, timeout=WAIT)


def test_thread_commands_and_the_slash_command_answer_on_the_page(page: Page, model: ModelServer) -> None:
    model.script(Reply(text="Hello from the model."))
    be(page, ADA)
    thread = mention(page, "say hello")
    expect(thread).to_contain_text("Hello from the model.", timeout=WAIT)
    reply(page, "@MM status")  # typed in any case, as Slack's client takes it
    status = thread.locator(".ephemeral").filter(has_text="Status:")
    expect(status).to_contain_text("Status: idle", timeout=WAIT)
    expect(status).to_contain_text("Asks before commands and edits: yes")  # the overlay's yolo off
    page.fill("#composer", "/mm help")
    page.press("#composer", "Enter")
    help_text = page.locator("#channel .ephemeral").filter(has_text="/mm")
    expect(help_text).to_be_visible(timeout=WAIT)


def test_the_app_home_shows_the_approver_what_waits_and_its_buttons_work(page: Page, model: ModelServer) -> None:
    model.script(
        Reply(tool_calls=[ToolCall("bash", {"command": "echo from-the-home-tab"})]),
        Reply(text="Approved from the App Home."),
    )
    be(page, ADA)
    thread = mention(page, "run it from home")
    approval(thread, "echo from-the-home-tab")
    be(page, GRACE)
    page.locator("#nav-home").click()
    home = page.locator("#home")
    expect(home).to_contain_text("In a thread of #playground", timeout=WAIT)
    expect(home).to_contain_text("echo from-the-home-tab")
    home.get_by_role("link", name="In a thread of #playground").click()  # the permalink opens the thread here
    expect(page.locator("#thread")).to_contain_text("run it from home")
    page.locator("#nav-home").click()
    home.get_by_role("button", name="Approve", exact=True).click()
    expect(home).not_to_contain_text("echo from-the-home-tab", timeout=WAIT)  # nothing waits any more
    page.locator("#nav-channel").click()
    expect(thread).to_contain_text("Approved from the App Home.", timeout=WAIT)
    expect(thread).to_contain_text("from-the-home-tab")


def test_what_people_and_the_model_write_is_shown_as_text_never_run(page: Page, model: ModelServer) -> None:
    model.script(
        Reply(text="<javascript:window.pwned=2|a link> [another](javascript:window.pwned=3) <b>bold?</b> *real bold*")
    )
    be(page, ADA)
    thread = mention(page, '<img src=x onerror="window.pwned=1"> hello')
    expect(thread.locator(".message").first).to_contain_text('<img src=x onerror="window.pwned=1">')
    expect(thread).to_contain_text("real bold", timeout=WAIT)
    answer = thread.locator(".message").filter(has_text="real bold")
    expect(answer).to_contain_text("<b>bold?</b>")
    assert answer.locator("a[href^='javascript']").count() == 0
    assert page.evaluate("window.pwned") is None
    assert page.locator("img[src='x']").count() == 0


@contextmanager
def page_alone() -> Iterator[tuple[SlackEmulator, PlaygroundPage]]:
    """The page and the emulator alone, in this process (no bot behind them): what a bot posts is what the page
    must show."""
    with SlackEmulator() as slack:
        slack.add_channel("C0PLAYGROUND", "playground")  # as `mm-bot playground` does
        page_server = PlaygroundPage(
            slack,
            bot_url="http://127.0.0.1:9",
            signing_secret="unused",
            workspaces=[dataclasses.replace(PLAYGROUND, team_id=slack.team_id)],  # the emulator's own team
            model=ModelInfo(False, "test-model", "http://127.0.0.1:9/v1", ""),
            overlay="channels: {}\n",
            config_path=None,
        ).start()
        try:
            yield slack, page_server
        finally:
            page_server.stop()


def test_a_person_attaches_a_file_the_agent_reads_it_and_its_card_is_drawn(page: Page, model: ModelServer) -> None:
    model.always(reads_shared_files)
    be(page, ADA)
    log = b"line one\nthe-word-in-the-attached-log\n"
    page.set_input_files("#file", files=[{"name": "build.log", "mimeType": "text/plain", "buffer": log}])
    expect(page.locator("#file-chosen")).to_contain_text("build.log")
    thread = mention(page, "what does the log say?")
    expect(page.locator("#file-chosen")).to_be_hidden()  # it went with the message
    # The worker downloaded it with the bot token, and the model read it with read_file.
    expect(thread).to_contain_text("done:", timeout=WAIT)
    expect(thread).to_contain_text("the-word-in-the-attached-log")
    assert any(call["name"] == "read_file" for call in _tool_calls(model))
    card = thread.locator(".message").first.locator(".file-card")
    expect(card).to_contain_text("build.log")
    expect(card).to_contain_text(f"Plain Text · {len(log)} B")

    # A picture in a reply, dropped on the thread's composer: its card shows a thumbnail drawn from its bytes.
    dropped = page.evaluate_handle(
        """([name, b64]) => {
            const transfer = new DataTransfer();
            const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
            transfer.items.add(new File([bytes], name, { type: "image/png" }));
            return transfer;
        }""",
        ["shot.png", base64.b64encode(PNG).decode()],
    )
    page.dispatch_event("#thread-composer-area", "drop", {"dataTransfer": dropped})
    expect(page.locator("#thread-file-chosen")).to_contain_text("shot.png")
    page.press("#thread-composer", "Enter")  # a file needs no text
    picture = thread.locator(".message").filter(has=page.locator(".file-card", has_text="shot.png"))
    expect(picture.locator("img.file-thumb")).to_be_visible(timeout=WAIT)
    assert picture.locator("img.file-thumb").evaluate("img => img.complete && img.naturalWidth") == 1
    expect(picture.locator(".file-card")).to_contain_text("Image")
    # The reply is a turn too: the model is asked to read the picture, and answers.
    expect(thread.locator(".message").filter(has_text="done:")).to_have_count(2, timeout=WAIT)


def test_a_file_larger_than_the_playground_takes_is_refused_with_a_sentence(page: Page, playground: Playground) -> None:
    be(page, ADA)
    big = b"x" * (MAX_FILE + 1)
    page.set_input_files("#file", files=[{"name": "huge.bin", "mimeType": "application/octet-stream", "buffer": big}])
    page.fill("#composer", "@mm take this huge file")
    page.press("#composer", "Enter")
    expect(page.locator("#error")).to_contain_text("huge.bin is too large for the playground (5.0 MB)")
    expect(page.locator("#error")).to_contain_text("at most 5.0 MB")
    # Nothing sent: the text and the file wait in the composer.
    expect(page.locator("#composer")).to_have_value("@mm take this huge file")
    expect(page.locator("#file-chosen")).to_contain_text("huge.bin")
    expect(page.locator("#channel")).not_to_contain_text("take this huge file")

    # The server refuses it too, whoever sends it: by its length before reading, or once read.
    data = base64.b64encode(big).decode()
    body = {"user": ADA, "text": "@mm huge", "file": {"name": "huge.bin", "data": data}}
    refused = httpx.post(f"{playground.base}/api/messages", json=body, timeout=30)
    assert refused.status_code == 413 and "too large for the playground" in refused.json()["error"], refused.text
    over = base64.b64encode(b"x" * (MAX_FILE * 2)).decode()
    body["file"] = {"name": "huger.bin", "data": over}
    by_length = httpx.post(f"{playground.base}/api/messages", json=body, timeout=30)
    assert by_length.status_code == 413 and "at most 5.0 MB" in by_length.json()["error"], by_length.text

    def chunks() -> Iterator[bytes]:  # no Content-Length: stopped at the bound as it is read
        yield b'{"user": "U0PGADA", "text": "x", "file": {"name": "a", "data": "'
        for _ in range(12):
            yield b"A" * 1024 * 1024
        yield b'"}}'

    chunked = httpx.post(
        f"{playground.base}/api/messages", content=chunks(), headers={"Content-Type": "application/json"}, timeout=30
    )
    assert chunked.status_code == 413 and "too large for the playground" in chunked.json()["error"], chunked.text
    text = str(httpx.get(f"{playground.base}/api/state", params={"user": ADA}).json()["messages"])
    assert "huge" not in text


def test_a_block_the_page_cannot_draw_is_shown_as_its_json(browser: Browser) -> None:
    with page_alone() as (slack, page_server):
        client = WebClient(token=slack.bot_token, base_url=slack.url)
        blocks = [
            {"type": "section", "text": {"type": "mrkdwn", "text": "a *known* block"}},
            # One Slack takes (the emulator refuses the others) that the page does not draw.
            {
                "type": "input",
                "label": {"type": "plain_text", "text": "Your name"},
                "element": {"type": "plain_text_input", "action_id": "name"},
            },
        ]
        client.chat_postMessage(channel="C0PLAYGROUND", text="fallback", blocks=blocks)
        # No bot listens here: a message is refused with a sentence, and the channel does not keep it.
        lost = httpx.post(f"{page_server.base}/api/messages", json={"user": PEOPLE[0].id, "text": "@mm hello"})
        assert lost.status_code == 502 and "the bot did not take it" in lost.json()["error"]
        assert [m["text"] for m in slack.messages("C0PLAYGROUND")] == ["fallback"]
        context = browser.new_context()
        page = context.new_page()
        page.goto(page_server.base)
        message = page.locator("#channel .message").filter(has_text="known")
        expect(message).to_contain_text("Block input — shown as JSON")
        expect(message.locator(".unknown-block")).to_contain_text('"label"')
        # Live: a later edit reaches the open page without a reload.
        ts = slack.messages("C0PLAYGROUND")[0]["ts"]
        client.chat_update(channel="C0PLAYGROUND", ts=ts, text="edited", blocks=[*blocks[:1], {"type": "divider"}])
        expect(message.locator(".unknown-block")).to_have_count(0)
        context.close()


def test_files_the_bot_uploads_and_people_share_are_drawn_as_slack_draws_them(browser: Browser) -> None:
    with page_alone() as (slack, page_server):
        client = WebClient(token=slack.bot_token, base_url=slack.url)
        client.chat_postMessage(channel="C0PLAYGROUND", text="the report follows")
        root = slack.messages("C0PLAYGROUND")[0]["ts"]
        # The worker's way to attach (files.getUploadURLExternal, the bytes, files.completeUploadExternal).
        client.files_upload_v2(channel="C0PLAYGROUND", thread_ts=root, filename="chart.png", content=PNG)
        client.files_upload_v2(channel="C0PLAYGROUND", thread_ts=root, filename="report.txt", content=b"ok\n" * 700)
        # Bytes that are no picture, whatever their name says: no thumbnail is served for them.
        fake = slack.share_file("C0PLAYGROUND", "<b>x</b>.png", b"<svg onload=alert(1)>", ADA, thread_ts=root)
        fake_id = fake["files"][0]["id"]
        assert httpx.get(f"{page_server.base}/api/files/{fake_id}").status_code == 404
        assert httpx.get(f"{page_server.base}/api/files/F0NOSUCHFILE").status_code == 404
        # No bot listens here: a file shared with a message the bot never took goes with it.
        shared_before = len(slack.shared)
        file = {"name": "lost.txt", "data": base64.b64encode(b"lost").decode()}
        lost = httpx.post(f"{page_server.base}/api/messages", json={"user": ADA, "text": "@mm hi", "file": file})
        assert lost.status_code == 502 and "the bot did not take it" in lost.json()["error"]
        assert len(slack.shared) == shared_before and "lost.txt" not in str(slack.files)
        [chart_id] = [i for i, f in slack.files.items() if f["name"] == "chart.png"]
        served = httpx.get(f"{page_server.base}/api/files/{chart_id}")
        assert served.content == PNG and served.headers["Content-Type"] == "image/png"

        context = browser.new_context()
        page = context.new_page()
        page.goto(page_server.base)
        page.locator("#channel .message").filter(has_text="the report follows").click()
        thread = page.locator("#thread")
        chart = thread.locator(".file-card", has_text="chart.png")
        expect(chart).to_contain_text(f"Image · {len(PNG)} B")
        thumb = thread.locator("img.file-thumb")
        expect(thumb).to_have_count(1)
        expect(thumb).to_have_attribute("src", f"/api/files/{chart_id}")
        assert thumb.evaluate("img => img.complete && img.naturalWidth") == 1
        expect(thread.locator(".file-card", has_text="report.txt")).to_contain_text("Plain Text · 2.1 KB")
        hostile = thread.locator(".file-card", has_text="<b>x</b>.png")  # its name as text, not markup
        expect(hostile).to_be_visible()
        assert thread.locator(".file-card b").count() == 0
        expect(thread.locator(".message", has=hostile).locator("img")).to_have_count(0)
        context.close()


def test_the_page_refuses_requests_from_other_sites_and_bad_input(playground: Playground) -> None:
    base = playground.base
    forged = httpx.post(
        f"{base}/api/messages",
        content='{"user": "U0PGADA", "text": "@mm rm -rf"}',
        headers={"Content-Type": "application/json", "Origin": "https://evil.example"},
    )
    assert forged.status_code == 403 and "another site" in forged.json()["error"]
    form = httpx.post(f"{base}/api/messages", data={"user": ADA, "text": "@mm hi"})
    assert form.status_code == 415
    rebound = httpx.get(f"{base}/api/state", params={"user": ADA}, headers={"Host": "attacker.example:80"})
    assert rebound.status_code == 403 and "only to localhost" in rebound.json()["error"]
    for body, error in (
        ({"user": "U0NOBODY", "text": "hi"}, "unknown user"),
        ({"user": ADA, "text": ""}, "no text"),
        ({"user": ADA, "text": "x" * 40_001}, "longer than Slack allows"),
        ({"user": ADA, "text": "hi", "thread_ts": "1.000001"}, "no thread"),
        ([1, 2], "JSON object"),
        ({"user": ADA, "text": "hi", "file": "a.txt"}, "must be an object"),
        ({"user": ADA, "file": {"name": "", "data": ""}}, "name must be printable"),
        ({"user": ADA, "file": {"name": "a\nb", "data": ""}}, "name must be printable"),
        ({"user": ADA, "file": {"name": "a.txt", "data": "not base64!"}}, "not base64"),
        ({"user": ADA, "file": {"name": "a.txt", "mimetype": "text", "data": ""}}, "type/subtype"),
    ):
        answer = httpx.post(f"{base}/api/messages", json=body)
        assert answer.status_code == 400 and error in answer.json()["error"], (body, answer.text)
    not_json = httpx.post(f"{base}/api/actions", content="{", headers={"Content-Type": "application/json"})
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]
    for escape in ("..%2F..%2Fpyproject.json", "..%2Fserver.js", "%2E%2E%2Fstatic%2Fapp.js"):
        assert httpx.get(f"{base}/static/{escape}").status_code == 404, escape
    for response in (httpx.get(f"{base}/no-such-page"), httpx.put(f"{base}/api/messages")):
        assert response.status_code in (404, 405) and response.headers["X-Frame-Options"] == "DENY"
    with httpx.stream("GET", f"{base}/api/events") as events:
        assert events.headers["X-Frame-Options"] == "DENY" and events.headers["Content-Type"] == "text/event-stream"
    # One playground a directory: a second would wipe the first's database and workspaces.
    second = subprocess.run(
        [MM_BOT, "playground", "--port", str(free_port()), "--no-browser"],
        cwd=playground.directory,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1 and "another playground runs from this directory" in second.stderr
    page = httpx.get(base)
    assert (
        page.headers["X-Frame-Options"] == "DENY"
        and "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    )
    assert forged.headers["X-Frame-Options"] == "DENY"  # on refusals too


def test_the_config_s_jobs_report_in_the_playground_channel_and_are_steered_there(
    tmp_path: Path, browser: Browser, model: ModelServer
) -> None:
    model.reset()
    model.always(Reply(text="The nightly chore is done."))
    redis = OwnRedis(tmp_path / "redis")  # not the module's: its playground's worker would take these runs
    redis.start()
    job = 'jobs:\n  - {name: nightly, schedule: "0 3 * * *", channel: C0ELSEWHERE, prompt: "do the chore"}\n'
    env = clean_env(CELERY_BROKER_URL=redis.url, MM_MODEL_URL=model.url, MM_MODEL="test-model")
    running = Playground("playground", env, config=job)
    try:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        page.goto(running.base)
        expect(page.locator("#overlay")).to_contain_text("C0PLAYGROUND")
        be(page, GRACE)
        page.fill("#composer", "/mm jobs")
        page.press("#composer", "Enter")
        expect(page.locator("#channel .ephemeral").filter(has_text="nightly")).to_contain_text("never run")
        page.fill("#composer", "/mm job run nightly")
        page.press("#composer", "Enter")
        root = page.locator("#channel .message").filter(has_text="nightly started").first
        expect(root).to_contain_text("🔧 nightly started by @grace", timeout=WAIT)
        root.click()
        thread = page.locator("#thread")
        expect(thread).to_contain_text("The nightly chore is done.", timeout=WAIT)
        expect(thread).to_contain_text("✅ nightly succeeded in", timeout=WAIT)
        context.close()
    finally:
        running.stop()
        redis.stop()


# --- two workspaces ---------------------------------------------------------------------------------------------


def test_two_workspaces_installed_through_oauth_each_answered_with_its_own_token(
    tmp_path: Path, browser: Browser, model: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mm-bot playground --workspaces 2`, run in this process so that the emulator's record of every call is at
    hand: the app installed in Acme and Globex through bolt's flow, a person in each workspace's channel answered,
    and every call in a workspace's channel made with the token Slack issued to that workspace's installation."""
    model.reset()
    model.always(lambda request: Reply(text=f"Answer about {_asked_about(request)}."))
    redis = OwnRedis(tmp_path / "redis")  # not the module's: its playground's worker would take these turns
    redis.start()
    directory = Path(tempfile.mkdtemp(prefix="mm-playground-"))  # the sandbox's user reaches it (Playground's)
    os.chmod(directory, 0o711)
    monkeypatch.chdir(directory)
    for name in CONFIG_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CELERY_BROKER_URL", redis.url)
    monkeypatch.setenv("MM_MODEL_URL", model.url)
    monkeypatch.setenv("MM_MODEL", "test-model")
    acme, globex = WORKSPACES
    said: list[str] = []
    checked: list[SlackEmulator] = []

    def person_in_each(slack: SlackEmulator, base: str) -> None:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        page.goto(base)
        switcher = page.get_by_role("group", name="Workspaces")
        expect(page.locator("#team-name")).to_have_text("Acme")
        expect(switcher.get_by_role("button", name="Acme")).to_have_attribute("aria-pressed", "true")
        be(page, ADA)
        thread = mention(page, "what is acme-1?")
        expect(thread).to_contain_text("Answer about acme-1.", timeout=WAIT)

        switcher.get_by_role("button", name="Globex").click()
        expect(page.locator("#team-name")).to_have_text("Globex")
        expect(switcher.get_by_role("button", name="Globex")).to_have_attribute("aria-pressed", "true")
        expect(page.locator("#channel-name")).to_have_text(globex.channel_name)
        expect(page.locator("#user")).to_have_value(globex.people[0].id)
        expect(page.locator("#thread")).to_be_hidden()  # Acme's thread is not in this channel
        expect(page.locator("#channel-messages")).not_to_contain_text("acme-1")
        thread = mention(page, "what is globex-2?")
        expect(thread).to_contain_text("Answer about globex-2.", timeout=WAIT)

        switcher.get_by_role("button", name="Acme").click()  # back as the person last chosen there
        expect(page.locator("#user")).to_have_value(ADA)
        expect(page.locator("#channel-messages")).to_contain_text("what is acme-1?")
        expect(page.locator("#channel-messages")).not_to_contain_text("globex-2")
        context.close()
        checked.append(slack)
        raise KeyboardInterrupt  # Ctrl-C: the playground stops its bot and worker as a person stops them

    # The playground takes Ctrl-C's and SIGTERM's handlers while it runs, as a command does.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = run_playground(
            None, "127.0.0.1", free_port(), browser=False, workspaces=2, speaker=said.append, on_ready=person_in_each
        )
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        redis.stop()
        shutil.rmtree(directory, ignore_errors=True)
    assert code == 0 and checked, said
    [slack] = checked
    assert "the app is installed in Acme and Globex through Slack's OAuth flow, each with a token of its own" in said

    # The tokens Slack issued in bolt's exchanges (oauth.v2.access), one per workspace, installed there.
    issued: dict[str, str] = {}
    for call in slack.calls_to("oauth.v2.access"):
        installation = slack.installation_of(call.response["access_token"])
        assert call.token is None and installation is not None and installation.team_id is not None
        issued[installation.team_id] = call.response["access_token"]
    assert sorted(issued) == sorted([acme.team_id, globex.team_id]) and len(set(issued.values())) == 2
    assert slack.calls_with(slack.bot_token) == []  # the emulator's own team's token, which no process was given

    channels = {w.channel_id: w for w in WORKSPACES}
    for workspace in WORKSPACES:
        token = issued[workspace.team_id]
        installation = slack.installation_of(token)
        assert installation is not None
        posted = [c for c in slack.calls_with(token) if c.method in ("chat.postMessage", "chat.startStream")]
        # Its answer was posted in its channel, with its token, as its installation's bot user.
        assert posted and {c.params["channel"] for c in posted} == {workspace.channel_id}
        threads = [slack.messages(workspace.channel_id, root["ts"]) for root in slack.messages(workspace.channel_id)]
        assert {m["user"] for thread in threads for m in thread if m.get("bot_id")} == {installation.bot_user_id}
    # Nothing in one workspace's channel came with another's token (nor without one).
    for call in slack.calls:
        channel = call.params.get("channel") or call.params.get("channel_id")
        if channel in channels:
            assert call.token == issued[channels[channel].team_id], (call.method, channel)


# --- the demo, as `make run` shows it on a fresh clone --------------------------------------------------------


def test_make_run_without_slack_or_model_plays_the_demo_to_its_end_in_the_browser(
    tmp_path: Path, browser: Browser
) -> None:
    nothing = free_port()  # no model answers there
    redis = OwnRedis(tmp_path / "redis")  # not the module's: its playground's worker would take these turns
    redis.start()
    env = clean_env(CELERY_BROKER_URL=redis.url, MM_MODEL_URL=f"http://127.0.0.1:{nothing}/v1")
    running = Playground("dev", env)  # what `make run` runs
    try:
        assert PLAYGROUND_INSTEAD in running.output()
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        page.goto(running.base)
        expect(page.locator("#model-banner")).to_contain_text("Demo model")
        expect(page.locator("#model-banner")).to_contain_text("MM_MODEL_URL")
        expect(page.locator("#overlay")).to_contain_text(GRACE)

        be(page, ADA)
        thread = mention(page, "fix the greeting")
        prompt = approval(thread, "python3 greet.py")
        be(page, GRACE)
        click(thread, "Approve", within=prompt)
        expect(thread).to_contain_text("hello, wrold", timeout=WAIT)

        edit = approval(thread, "greet.py")
        expect(edit).to_contain_text('print("hello, world")')  # the diff, before anyone decides
        # The picture once the thread has settled: the text before the edit streamed whole, the status gone.
        expect(thread.locator(".streaming")).to_have_count(0, timeout=WAIT)
        expect(thread.get_by_role("button", name="Stop", exact=True)).to_have_count(0, timeout=WAIT)
        _screenshot(page, tmp_path)
        click(thread, "Approve", within=edit)
        answer = thread.locator(".message").filter(has_text="it now says")
        expect(answer).to_contain_text(_plain(LABEL), timeout=WAIT)
        expect(thread).to_contain_text("command(s)", timeout=WAIT)  # the recap ends the turn
        # The channel counts the replies the thread shows (the status messages a turn deletes are not counted).
        counted = page.locator("#channel .replies").first.inner_text()
        expect(thread.locator(".thread-divider")).to_contain_text(counted)
        for said in thread.locator(".message").filter(has_text="Demo model").all():
            assert _plain(LABEL) in said.inner_text()
        context.close()
    finally:
        running.stop()
        redis.stop()


def test_the_demo_s_changes_open_a_pull_request_on_the_playground_s_forge(tmp_path: Path, browser: Browser) -> None:
    nothing = free_port()  # no model answers there: the demo plays, on the forge emulator's repository
    redis = OwnRedis(tmp_path / "redis")  # not the module's: its playground's worker would take these turns
    redis.start()
    env = clean_env(CELERY_BROKER_URL=redis.url, MM_MODEL_URL=f"http://127.0.0.1:{nothing}/v1")
    running = Playground("playground", env)
    try:
        base = running.base
        forge_url = httpx.get(f"{base}/api/state", params={"user": ADA}).json()["forge_url"]
        assert re.fullmatch(r"https://127\.0\.0\.1:\d+/", forge_url), forge_url
        overlay = (running.directory / PLAYGROUND_DIR / "overlay.yaml").read_text()
        assert f"repo: {forge_url}{DEMO_REPO}.git" in overlay
        assert f"{forge_url[len('https://') : -1]}:\n    kind: github" in overlay

        sent = httpx.post(f"{base}/api/messages", json={"user": ADA, "text": "@mm fix the greeting"}, timeout=30)
        root = sent.json()["ts"]
        clicked: set[str] = set()
        for _ in ("the command", "the edit"):
            prompt = _thread_message(base, root, lambda m: Action.APPROVE in _buttons(m) and m["ts"] not in clicked)
            _press(base, prompt, Action.APPROVE, GRACE)
            clicked.add(prompt["ts"])
        offer = _thread_message(base, root, lambda m: Action.PULL_REQUEST in _buttons(m))
        assert _buttons(offer)[Action.PULL_REQUEST]["text"]["text"] == LABELS[Action.PULL_REQUEST]
        _press(base, offer, Action.PULL_REQUEST, GRACE)
        opened = _thread_message(base, root, lambda m: "opened <" in m.get("text", ""))["text"]
        link = re.search(r"opened <(?P<url>[^|>]+)\|pull request #1>", opened)
        assert link is not None and link["url"] == f"{forge_url}{DEMO_REPO}/pull/1", opened

        # The emulator's page lists it, over HTTPS the worker's bundle trusts.
        trust = ssl.create_default_context(cafile=running.directory / PLAYGROUND_DIR / "ca-bundle.pem")
        assert trust.cert_store_stats()["x509_ca"] > 1  # and the CAs trusted before it (a hosted model's)
        listing = httpx.get(forge_url, verify=trust).text
        assert f'<a href="{link["url"]}">{DEMO_REPO}#1 ' in listing
        assert "<span class=state>open</span>" in listing

        context = browser.new_context()
        page = context.new_page()
        page.goto(base)
        expect(page.locator("#forge-line")).to_contain_text(f"Pull requests: {forge_url}")
        expect(page.locator("#forge-line a")).to_have_attribute("href", forge_url)
        context.close()

        # The worker has the token; nothing a person sees does.
        [token] = {_environ(pid).get(FORGE_TOKEN_ENV) for pid in _pids(running, "worker")}
        assert token
        for user in (ADA, GRACE, LINUS):
            assert token not in httpx.get(f"{base}/api/state", params={"user": user}).text
        assert token not in overlay and token not in running.output()
    finally:
        running.stop()
        redis.stop()


def _buttons(message: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        e["action_id"]: e | {"block_id": b.get("block_id", "")}
        for b in message.get("blocks") or []
        if b["type"] == "actions"
        for e in b["elements"]
    }


def _thread_message(base: str, root: str, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The first message of thread `root`, as the page's API shows it, that is `wanted`, once there is one."""
    deadline = time.monotonic() + WAIT / 1000
    thread: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        messages = httpx.get(f"{base}/api/state", params={"user": GRACE}).json()["messages"]
        thread = [m for m in messages if m.get("thread_ts", m["ts"]) == root]
        if found := next((m for m in thread if wanted(m)), None):
            return found
        time.sleep(0.2)
    raise AssertionError(f"no such message in the thread: {[m.get('text') for m in thread]}")


def _press(base: str, message: dict[str, Any], action: Action, user: str) -> None:
    """A click on the message's button, as the page sends it."""
    button = _buttons(message)[action]
    body = {
        "user": user,
        "message_ts": message["ts"],
        "action_id": action.value,
        "block_id": button["block_id"],
        "value": button.get("value", ""),
        "text": button["text"]["text"],
    }
    answer = httpx.post(f"{base}/api/actions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text


def _pids(running: Playground, name: str) -> list[int]:
    return [int(p.split()[0]) for p in session_processes(running.process.pid) if f" {name} " in p]


def _environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_text(errors="replace").split("\0")
    return {name: value for name, _, value in (pair.partition("=") for pair in pairs if pair)}


def _screenshot(page: Page, tmp_path: Path) -> None:
    """The README's picture: a thread with an approval message, as the suite sees it."""
    target = SCREENSHOT if os.environ.get(UPDATE_SCREENSHOT) else tmp_path / "playground.png"
    page.screenshot(path=str(target))
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _plain(mrkdwn: str) -> str:
    return re.sub(r"[*_~]", "", mrkdwn)


def _tool_calls(model: ModelServer) -> list[dict[str, Any]]:
    return [
        call["function"] for m in model.messages(-1) if m["role"] == "assistant" for call in m.get("tool_calls") or []
    ]


def _asked_about(request: dict[str, Any]) -> str:
    """The thing a two-workspace question names (`acme-1`, `globex-2`), from the request's last user message."""
    found = re.search(r"(?:acme|globex)-\d", _last_user_text(request))
    return found[0] if found else "nothing"


def _last_user_text(request: dict[str, Any]) -> str:
    user = [m for m in request["messages"] if m["role"] == "user"]
    content = user[-1]["content"] if user else ""
    return content if isinstance(content, str) else " ".join(part.get("text", "") for part in content)
