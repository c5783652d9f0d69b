"""Files to people: the agent's answer attaches workspace files with `[attach: path]` lines, and the worker
uploads them into the thread through the gateway, within the bounds: inside the workspace, no link followed,
regular files of at most `workspaces.files.maxMB`, at most `maxAttachments` an answer. Real parts: a
`celery worker`, PostgreSQL, a Redis of the test's own, the Slack emulator and the scripted model."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mm_testkit.redis_server import OwnRedis
from playground.model_server import Reply
from threads_support import Stack, config, policy, stack
from workers import attachments

pytestmark = [pytest.mark.timeout(240), pytest.mark.process]

ASKED = ["report.txt", "../outside.txt", "link.txt", "sub/secret.txt", "big.bin", "missing.txt", "/etc/hostname"]


@pytest.fixture
def threads(tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis) -> Iterator[Stack]:
    files = "workspaces: {files: {maxMB: 0.01, maxAttachments: 6}}"
    with stack(tmp_path, fresh_pg_url, own_redis.url, config=config("{yolo: true}", files)) as s:
        yield s


def attaching(request: dict[str, Any]) -> Reply:
    """The model: asked to attach, it answers with the `[attach: …]` lines of ASKED; else the usual policy."""
    if request["messages"][-1]["content"] == "attach them":
        return Reply(text="Here they are.\n" + "\n".join(f"[attach: {path}]" for path in ASKED))
    return policy(request)


def answered(s: Stack, session_id: str, turns: int) -> None:
    s.wait(lambda: s.turns_ended(session_id) >= turns and s.status(session_id) == "idle", message=f"turn {turns}")


def test_an_answer_attaches_workspace_files_and_the_bounds_refuse_the_rest(threads: Stack) -> None:
    s = threads
    s.model.always(attaching)
    s.start_worker()
    first = s.post("hello")
    answered(s, first.session_id, 1)
    assert "[attach: path/relative/to/the/workspace]" in s.model.messages()[0]["content"]  # the system prompt

    workspace = s.workspace(first.session_id)
    outside = Path(tempfile.mkdtemp(prefix="mm-outside-"))
    (outside / "secret.txt").write_text("outside the workspace\n")
    (workspace.parent / "outside.txt").write_text("beside the workspace\n")
    (workspace / "report.txt").write_text(f"the report, with the bot's token {s.slack.bot_token} in it\n")
    (workspace / "link.txt").symlink_to(outside / "secret.txt")
    (workspace / "sub").symlink_to(outside, target_is_directory=True)
    (workspace / "big.bin").write_bytes(b"0" * 20_000)

    s.post("attach them", thread_ts=first.thread_ts)
    answered(s, first.session_id, 2)
    s.wait(lambda: "/etc/hostname" in s.thread_text(first.thread_ts), message="the last refusal")

    uploads = list(s.slack.uploads.items())
    assert len(uploads) == 1  # only report.txt
    file_id, data = uploads[0]
    assert s.slack.files[file_id]["name"] == "report.txt"
    assert data == b"the report, with the bot's token *** in it\n"  # scrubbed by the gateway
    [shared] = [m for m in s.slack.messages("C0THREADS", first.thread_ts) if m.get("files")]
    assert shared["thread_ts"] == first.thread_ts and shared["files"][0]["id"] == file_id

    text = s.thread_text(first.thread_ts)
    for line in [
        "`../outside.txt` was not attached: it is outside the workspace.",
        "`link.txt` was not attached: a link is on its way, and links are not followed.",
        "`sub/secret.txt` was not attached: a link is on its way, and links are not followed.",
        "`big.bin` was not attached: it is 20 KB, and a file may be at most 10 KB.",
        "`missing.txt` was not attached: there is no such file in the workspace.",
        "`/etc/hostname` was not attached: an answer attaches at most 6 files.",
    ]:
        assert line in text


def test_a_directory_or_a_fifo_named_for_attaching_is_refused_and_no_descriptor_is_left(tmp_path: Path) -> None:
    # `[attach: src]`: fdopen of a directory raised before the type was checked, leaving its descriptor open (50
    # such answers, 50 descriptors of a long-lived worker), and the thread was told Slack refused it.
    (tmp_path / "src").mkdir()
    os.mkfifo(tmp_path / "pipe")
    before = len(os.listdir("/proc/self/fd"))
    for name in ["src", "pipe"] * 25:
        with pytest.raises(attachments.Refused, match="it is not a regular file"):
            attachments.read(tmp_path, name, 1 << 20)
    assert len(os.listdir("/proc/self/fd")) == before
