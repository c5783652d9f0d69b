"""A thread's changes leave the worker: after a turn that changed files the thread offers a "Push branch" button;
an approver's click (or `@mm push BRANCH`) pushes them to a new branch of the repository, a writer of the thread
is refused as for an approval, and a name that is no branch is refused before anything runs. The real bot, a
worker, PostgreSQL, the emulator and a local bare repository."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mm_testkit.redis_server import OwnRedis
from playground.signed import SlackEventSender
from threads_support import CHANNEL, SECRET, Stack, buttons, config, policy, repositories, stack

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

APPROVER, ALICE = "U0BOB", "U0ALICE"


@pytest.fixture
def thread(tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis) -> Iterator[tuple[Stack, SlackEventSender, Path]]:
    _origin, bare = repositories(tmp_path)
    channel = f"{{yolo: true, repo: {bare}, approvers: [{APPROVER}]}}"
    with stack(tmp_path, fresh_pg_url, own_redis.url, config=config(channel)) as s:
        s.model.always(policy)
        for user, name in ((APPROVER, "bob"), (ALICE, "alice")):
            s.slack.add_user(user, name)
        s.start_worker()
        base = s.start_bot()
        with SlackEventSender(base, SECRET, response_url=s.slack.response_url) as sender:
            yield s, sender, bare


def show(bare: Path, ref: str) -> str:
    shown = subprocess.run(["git", "--git-dir", str(bare), "show", ref], capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else f"(missing: {shown.stderr.strip()})"


def test_an_approver_pushes_a_thread_s_changes_with_the_button_or_the_keyword(thread) -> None:
    s, sender, bare = thread
    root = sender.new_ts()
    sender.app_mention("<@U0BOT> run: echo first > notes.txt", channel=CHANNEL, user=ALICE, ts=root)
    offer = s.wait(
        lambda: next((m for m in s.slack.messages(CHANNEL, root) if "changed file(s)" in m.get("text", "")), None),
        message="the Push branch button",
    )
    assert offer["text"] == "📦 1 changed file(s) in this thread's workspace: an approver can push them to a branch."
    value = buttons(offer)["push"]

    # Alice wrote in this thread: like an approval of her own request, her click is refused.
    sender.block_action("push", value, user=ALICE, channel=CHANNEL, message_ts=offer["ts"], thread_ts=root)
    refused = s.wait(lambda: [e for e in s.slack.ephemerals if e.get("to_user") == ALICE], message="alice refused")
    assert "Only this channel's approvers may push a thread's changes" in refused[0]["text"]

    sender.block_action("push", value, user=APPROVER, channel=CHANNEL, message_ts=offer["ts"], thread_ts=root)
    branch = f"mm/thread-{root.replace('.', '-')}"
    said = s.wait(lambda: "pushed" in (t := s.thread_text(root)) and t, message="the push's answer")
    assert f"⬆️ <@{APPROVER}> pushed `{branch}` to {bare} (" in said and "1 file(s) changed" in said
    assert show(bare, f"{branch}:notes.txt") == "first\n"
    assert show(bare, "main:README.md") == "a repository\n"  # nothing else moved

    # The keyword, with a branch named; and a name that is no branch.
    sender.app_mention("<@U0BOT> run: echo second > more.txt", channel=CHANNEL, user=ALICE, thread_ts=root)
    s.wait(lambda: s.thread_text(root).count("changed file(s)") == 2, message="the second offer")
    sender.app_mention("<@U0BOT> push ../escape", channel=CHANNEL, user=APPROVER, thread_ts=root)
    s.wait(lambda: any("is not a branch name" in e["text"] for e in s.slack.ephemerals), message="bad branch")
    sender.app_mention("<@U0BOT> push main", channel=CHANNEL, user=APPROVER, thread_ts=root)
    s.wait(lambda: "`main` is the repository's own branch" in s.thread_text(root), message="main refused")
    assert show(bare, "main:README.md") == "a repository\n" and "more.txt" not in show(bare, "main")
    sender.app_mention("<@U0BOT> push chores/notes", channel=CHANNEL, user=APPROVER, thread_ts=root)
    s.wait(lambda: "pushed `chores/notes`" in s.thread_text(root), message="the keyword's push")
    assert show(bare, "chores/notes:more.txt") == "second\n" and show(bare, "chores/notes:notes.txt") == "first\n"


def test_a_push_failure_in_git_s_words_notifies_nobody(thread) -> None:
    """git's words are the repository's and the model's text: a directory named `<!channel> URGENT` that makes the
    push fail reaches the thread as text, never as a channel-wide notification in the bot's voice."""
    s, sender, _bare = thread
    root = sender.new_ts()
    # An embedded repository with no commit: `git add --all` refuses it, naming the directory.
    command = "mkdir -p '<!channel> URGENT' && git -C '<!channel> URGENT' init -q && echo x > '<!channel> URGENT/x'"
    sender.app_mention(f"<@U0BOT> run: {command}", channel=CHANNEL, user=ALICE, ts=root)
    offer = s.wait(
        lambda: next((m for m in s.slack.messages(CHANNEL, root) if "changed file(s)" in m.get("text", "")), None),
        message="the Push branch button",
    )
    sender.block_action(
        "push", buttons(offer)["push"], user=APPROVER, channel=CHANNEL, message_ts=offer["ts"], thread_ts=root
    )
    failed = s.wait(
        lambda: next((m for m in s.slack.messages(CHANNEL, root) if "failed" in m.get("text", "")), None),
        message="the push's failure",
    )
    assert "does not have a commit checked out" in failed["text"]
    assert "&lt;!channel&gt; URGENT" in failed["text"]
    posted = [m.get("text", "") for m in s.slack.messages(CHANNEL, root)]
    assert not any("<!channel>" in text for text in posted), posted
