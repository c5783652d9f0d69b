"""Files people share in a thread reach the agent: the real bot (`mm-bot serve`) records the message with its
files, a real `celery worker` downloads them with the bot token from the Slack emulator into the workspace's
`.mm/uploads/<message ts>/`, and the model reads them with its tools. The bounds: a file too large, a link or a
redirect off Slack, a hostile name, a link the model put in the workspace."""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from chatops.schema import Session
from mm_testkit.redis_server import OwnRedis
from playground.signed import SlackEventSender
from playground.slack_api import LOGIN_PAGE
from threads_support import CHANNEL, SECRET, Stack, config, reads_shared_files, stack
from workers.uploads import SlackHosts, safe_name

pytestmark = [pytest.mark.timeout(240), pytest.mark.process]

LOG = b"line one\nthe-secret-word-in-the-log\n"


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def started(tmp_path: Path, fresh_pg_url: str, redis: OwnRedis, *extra: str) -> AbstractContextManager[Stack]:
    return stack(tmp_path, fresh_pg_url, redis.url, config=config("{yolo: true}", *extra))


def session_of(s: Stack, thread_ts: str) -> str:
    def find() -> str | None:
        with s.engine.connect() as conn:
            return conn.execute(
                select(Session.id).where(Session.channel_id == CHANNEL, Session.thread_ts == thread_ts)
            ).scalar_one_or_none()

    return s.wait(find, message=f"the session of {thread_ts}")


def turns(s: Stack, session_id: str, n: int) -> None:
    s.wait(lambda: s.turns_ended(session_id) >= n and s.status(session_id) == "idle", message=f"turn {n}")


def user_messages(s: Stack) -> list[str]:
    return [m["content"] for m in s.model.messages() if m["role"] == "user"]


def test_a_shared_file_is_downloaded_into_the_workspace_and_read_by_the_agent(
    tmp_path: Path, fresh_pg_url: str, redis: OwnRedis
) -> None:
    with started(tmp_path, fresh_pg_url, redis) as s:
        s.model.always(reads_shared_files)
        s.start_worker()
        base = s.start_bot()
        with SlackEventSender(base, SECRET, bot_user_id=s.slack.bot_user_id) as sender:
            # The file shared with the mention that starts the thread (an app_mention carries `files` too).
            shared = s.slack.share_file(CHANNEL, "log.txt", LOG, "U0ALICE", text="<@U0BOT> what is in it?")
            mention = {"channel": CHANNEL, "user": "U0ALICE", "ts": shared["ts"]}
            assert sender.app_mention(shared["text"], files=shared["files"], **mention).status_code == 200
            root = shared["ts"]
            session_id = session_of(s, root)
            turns(s, session_id, 1)
            workspace = s.workspace(session_id)
            assert (workspace / ".mm" / "uploads" / root / "log.txt").read_bytes() == LOG
            assert f"[files: .mm/uploads/{root}/log.txt ({len(LOG)} bytes)]" in user_messages(s)[-1]
            tool_results = [m["content"] for m in s.model.messages() if m["role"] == "tool"]
            assert any("the-secret-word-in-the-log" in m for m in tool_results)  # read_file's result reached it
            assert "done:" in s.thread_text(root) and "the-secret-word-in-the-log" in s.thread_text(root)
            assert s.slack.downloads == [(shared["files"][0]["id"], True)]  # with the bot token

            # Hostile names, shared in the thread (`file_share` messages): each lands inside .mm/uploads/<ts>/.
            for n, name in enumerate(["../../etc/passwd", ".git/config", "log.txt"], start=2):
                reply = s.slack.share_file(CHANNEL, name, b"hostile\n", "U0ALICE", text="", thread_ts=root)
                where = {"channel": CHANNEL, "user": "U0ALICE", "ts": reply["ts"], "thread_ts": root}
                assert sender.message("", files=reply["files"], **where).status_code == 200
                turns(s, session_id, n)
                folder = workspace / ".mm" / "uploads" / reply["ts"]
                assert [p.name for p in folder.iterdir()] == [safe_name(name)]
                assert (folder / safe_name(name)).read_bytes() == b"hostile\n"
            assert safe_name("../../etc/passwd") == "_._etc_passwd" and safe_name(".git/config") == "git_config"
            assert not (workspace / ".git").exists() and not (workspace.parent / "etc").exists()
            # Never pushed: the uploads' folder ignores itself (not `.mm`, whose .gitignore a repository may track).
            assert (workspace / ".mm" / "uploads" / ".gitignore").read_text().splitlines()[-1] == "*"


def test_a_link_in_the_workspace_is_not_followed_by_a_download(
    tmp_path: Path, fresh_pg_url: str, redis: OwnRedis
) -> None:
    outside = Path(tempfile.mkdtemp(prefix="mm-outside-"))
    with started(tmp_path, fresh_pg_url, redis) as s:
        s.start_worker()
        base = s.start_bot()
        with SlackEventSender(base, SECRET, bot_user_id=s.slack.bot_user_id) as sender:
            assert sender.app_mention("<@U0BOT> hello", channel=CHANNEL, user="U0ALICE").status_code == 200
            root = sender.last_payload["event"]["ts"]
            session_id = session_of(s, root)
            turns(s, session_id, 1)
            # The model made `.mm` a link out of its workspace (it may: the workspace is its own).
            (s.workspace(session_id) / ".mm").symlink_to(outside, target_is_directory=True)
            reply = s.slack.share_file(CHANNEL, "notes.txt", b"notes\n", "U0ALICE", text="see", thread_ts=root)
            where = {"channel": CHANNEL, "user": "U0ALICE", "ts": reply["ts"], "thread_ts": root}
            assert sender.message("see", files=reply["files"], **where).status_code == 200
            turns(s, session_id, 2)
            assert list(outside.iterdir()) == []
            assert "`notes.txt` could not be written into the workspace" in s.thread_text(root)
            assert "[files not taken (too large, or not downloadable): notes.txt]" in user_messages(s)[-1]


def test_files_too_large_or_off_slack_are_refused_with_a_line_in_the_thread(
    tmp_path: Path, fresh_pg_url: str, redis: OwnRedis
) -> None:
    with started(tmp_path, fresh_pg_url, redis, "workspaces: {files: {maxMB: 0.01, maxTurnMB: 0.015}}") as s:
        s.start_worker()
        base = s.start_bot()
        # The emulator refuses a download without the bot token, as Slack does: a redirect to its login page.
        key_url = s.slack.share_file(CHANNEL, "x.txt", b"x", "U0BOB")["files"][0]["url_private_download"]
        anonymous = httpx.get(key_url, follow_redirects=True)
        assert anonymous.text == LOGIN_PAGE and anonymous.history[0].status_code == 302
        s.slack.downloads.clear()

        with SlackEventSender(base, SECRET, bot_user_id=s.slack.bot_user_id) as sender:
            assert sender.app_mention("<@U0BOT> hello", channel=CHANNEL, user="U0ALICE").status_code == 200
            root = sender.last_payload["event"]["ts"]
            session_id = session_of(s, root)
            turns(s, session_id, 1)
            off_slack = f"http://localhost:{s.slack.port}/files-pri/elsewhere"
            big = s.slack.share_file(CHANNEL, "big.bin", b"0" * 20_000, "U0ALICE", text="a", thread_ts=root)
            # Its size said small (a lie): refused while it is read, nothing of it kept.
            liar = s.slack.share_file(CHANNEL, "liar.bin", b"1" * 20_000, "U0ALICE", thread_ts=root, size=10)
            moved = s.slack.share_file(CHANNEL, "moved.txt", b"m", "U0ALICE", thread_ts=root, redirect_to=off_slack)
            forged = dict(moved["files"][0], id="F0FORGED", name="forged.txt", url_private_download=off_slack + "/f")
            small = s.slack.share_file(CHANNEL, "small.txt", b"s" * 8_000, "U0ALICE", thread_ts=root)
            second = s.slack.share_file(CHANNEL, "second.txt", b"t" * 8_000, "U0ALICE", thread_ts=root)
            files = [*big["files"], *liar["files"], *moved["files"], forged, *small["files"], *second["files"]]
            where = {"channel": CHANNEL, "user": "U0ALICE", "ts": big["ts"], "thread_ts": root}
            assert sender.message("look", files=files, **where).status_code == 200
            turns(s, session_id, 2)

        text = s.thread_text(root)
        assert "`big.bin` was not taken: it is 20 KB, and a file may be at most 10 KB." in text
        assert "`liar.bin` was not taken: it is larger, and a file may be at most 10 KB." in text
        for name in ("moved.txt", "forged.txt"):
            assert f"`{name}` could not be downloaded from Slack (its link leads off Slack, to localhost:" in text
        assert "`second.txt` was not taken: the files of this turn may be at most" in text
        folder = s.workspace(session_id) / ".mm" / "uploads" / big["ts"]
        assert sorted(p.name for p in folder.iterdir()) == ["small.txt"]
        # The redirect off Slack was not followed, and the forged link was never asked for (nor sent the token).
        asked = [file_id for file_id, _ in s.slack.downloads]
        assert "F0FORGED" not in asked and asked.count(moved["files"][0]["id"]) == 1
        prompt = user_messages(s)[-1]
        assert f"[files: .mm/uploads/{big['ts']}/small.txt (8 KB)]" in prompt
        not_taken = "big.bin, liar.bin, moved.txt, forged.txt, second.txt"
        assert f"[files not taken (too large, or not downloadable): {not_taken}]" in prompt


PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000") + b"rest-of-a-tiny-png"


@pytest.mark.parametrize("vision", [True, False])
def test_an_image_goes_to_a_model_that_takes_images_and_is_a_file_either_way(
    tmp_path: Path, fresh_pg_url: str, redis: OwnRedis, vision: bool
) -> None:
    with started(tmp_path, fresh_pg_url, redis, f"model: {{vision: {str(vision).lower()}}}") as s:
        s.model.always(reads_shared_files)
        s.start_worker()
        base = s.start_bot()
        with SlackEventSender(base, SECRET, bot_user_id=s.slack.bot_user_id) as sender:
            shared = s.slack.share_file(CHANNEL, "shot.png", PNG, "U0ALICE", text="<@U0BOT> what is this?")
            mention = {"channel": CHANNEL, "user": "U0ALICE", "ts": shared["ts"]}
            assert sender.app_mention(shared["text"], files=shared["files"], **mention).status_code == 200
            session_id = session_of(s, shared["ts"])
            turns(s, session_id, 1)
        assert (s.workspace(session_id) / ".mm" / "uploads" / shared["ts"] / "shot.png").read_bytes() == PNG
        line = f"[files: .mm/uploads/{shared['ts']}/shot.png ({len(PNG)} bytes)]"
        content = user_messages(s)[-1]
        if vision:
            assert content == [
                {"type": "text", "text": f"what is this?\n{line}"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()}},
            ]
        else:
            assert content == f"what is this?\n{line}"


def test_only_slack_hosts_get_the_token() -> None:
    slack = SlackHosts("https://slack.com/api/")
    assert slack.allow("https://files.slack.com/files-pri/T1-F1/download/a.txt")
    assert not slack.allow("http://files.slack.com/files-pri/T1-F1/download/a.txt")  # not over plain HTTP
    assert not slack.allow("https://files.slack.com.evil.example/x")
    assert not slack.allow("https://evilslack.com/x")
    emulator = SlackHosts("http://127.0.0.1:8080/api/")
    assert emulator.allow("http://127.0.0.1:8080/files-pri/x")
    assert not emulator.allow("http://127.0.0.1:8081/files-pri/x")
    assert not emulator.allow("http://localhost:8080/files-pri/x")
    assert not emulator.allow("http://127.0.0.1:notaport/x")
    for hostile in ["..", ".", "", "\x00\x1b[31m", "/", ".bashrc", "a/../../b"]:
        name = safe_name(hostile)
        assert name and "/" not in name and ".." not in name and not name.startswith(".")
    assert safe_name("x" * 500 + ".txt").endswith(".txt") and len(safe_name("x" * 500 + ".txt")) == 200


def test_a_file_on_a_request_with_inline_options_reaches_the_agent_and_a_command_s_is_said_not_taken(
    tmp_path: Path, fresh_pg_url: str, redis: OwnRedis
) -> None:
    with started(tmp_path, fresh_pg_url, redis) as s:
        # `model=big` names a configured model: the message is a command (options), whose prompt keeps its files.
        models = f"models: {{big: {{url: {s.model.url}, name: big-model}}}}"
        (tmp_path / "mm.yaml").write_text(config("{yolo: true}", models))
        s.model.always(reads_shared_files)
        s.start_worker()
        base = s.start_bot()
        with SlackEventSender(base, SECRET, bot_user_id=s.slack.bot_user_id) as sender:
            text = "<@U0BOT> model=big read the log"
            shared = s.slack.share_file(CHANNEL, "log.txt", LOG, "U0ALICE", text=text)
            mention = {"channel": CHANNEL, "user": "U0ALICE", "ts": shared["ts"]}
            assert sender.app_mention(shared["text"], files=shared["files"], **mention).status_code == 200
            assert sender.message(shared["text"], files=shared["files"], **mention).status_code == 200  # its twin
            root = shared["ts"]
            session_id = session_of(s, root)
            turns(s, session_id, 1)
            assert (s.workspace(session_id) / ".mm" / "uploads" / root / "log.txt").read_bytes() == LOG
            assert f"[files: .mm/uploads/{root}/log.txt ({len(LOG)} bytes)]" in user_messages(s)[-1]
            assert s.model.requests[-1].json["model"] == "big-model"
            assert "the-secret-word-in-the-log" in s.thread_text(root)  # read_file's result, quoted
            assert s.slack.downloads == [(shared["files"][0]["id"], True)]  # once, for the mention and its twin

            # A command carries no files: the person is told, the files are not silently lost.
            reply = s.slack.share_file(CHANNEL, "more.txt", b"x\n", "U0ALICE", text="<@U0BOT> status", thread_ts=root)
            where = {"channel": CHANNEL, "user": "U0ALICE", "ts": reply["ts"], "thread_ts": root}
            assert sender.app_mention(reply["text"], files=reply["files"], **where).status_code == 200
            said = "I did not take the files on that message (`more.txt`)"
            s.wait(lambda: any(said in (m.get("text") or "") for m in s.slack.ephemerals), message="the note")
            assert any("*Model:* big" in (m.get("text") or "") for m in s.slack.ephemerals)  # status still answered
            assert len(s.slack.downloads) == 1

            # A request refused for its options runs nothing, and takes none of its files: it says so too.
            text = "<@U0BOT> model=huge read this one"
            refused = s.slack.share_file(CHANNEL, "other.txt", b"y\n", "U0ALICE", text=text, thread_ts=root)
            where = {"channel": CHANNEL, "user": "U0ALICE", "ts": refused["ts"], "thread_ts": root}
            assert sender.app_mention(refused["text"], files=refused["files"], **where).status_code == 200
            said = "I did not take the files on that message (`other.txt`)"
            s.wait(lambda: any(said in (m.get("text") or "") for m in s.slack.ephemerals), message="the other note")
            assert "There is no model named `huge`" in s.thread_text(root)
            assert len(s.slack.downloads) == 1 and s.turns_ended(session_id) == 1
