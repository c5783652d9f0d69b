"""Pull requests through the real processes: the bot, a worker (with beat: housekeeping follows the checks),
PostgreSQL, Redis, the Slack emulator, the scripted model and the forge emulator over HTTPS (its git side
served by git's own http-backend). Each forge kind is exercised once: GitHub from a thread, GitLab from a job,
Gitea from `@mm pr`, a GitHub App for the refusals and the retry after a rate limit."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select, update

from chatops.schema import PullRequestRecord, Session
from forge_support import new_branch
from mm_testkit.redis_server import OwnRedis
from playground.forge_server import ForgeServer, Kind
from playground.model_server import Reply, ToolCall
from playground.signed import SlackEventSender
from threads_support import CHANNEL, SECRET, Stack, buttons, config, finished, policy, run_now, stack

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

BOB, ALICE = "U0BOB", "U0ALICE"
TOKEN = "forge-secret-token-7f3a9c"  # what must never show in a thread, a log or the sandbox
TOKEN_ENVS = {"github": "MM_GITHUB_TOKEN", "gitlab": "MM_GITLAB_TOKEN", "gitea": "MM_GITEA_TOKEN"}


@dataclass
class Forged:
    s: Stack
    sender: SlackEventSender
    forge: ForgeServer
    path: str
    clone: str

    def offer(self, root: str, count: int = 1) -> dict[str, Any]:
        """The thread's `count`-th offer of its changes (the message with the push buttons), once the turn that
        posted it has ended: the offer comes a moment before the session says idle, as a person would click."""

        def find() -> dict[str, Any] | None:
            offers = [m for m in self.s.slack.messages(CHANNEL, root) if "changed file(s)" in m.get("text", "")]
            return offers[count - 1] if len(offers) >= count else None

        def ended() -> bool:
            with self.s.engine.connect() as conn:
                status = conn.execute(select(Session.status).where(Session.thread_ts == root)).scalar_one_or_none()
            return status == "idle"

        try:
            found = self.s.wait(find, message=f"offer {count}")
            self.s.wait(ended, message="the turn's end")
            return found
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- the thread:\n{self.s.thread_text(root)}") from None

    def click(self, message: dict[str, Any], action: str, user: str, root: str) -> None:
        value = buttons(message)[action]
        answer = self.sender.block_action(
            action, value, user=user, channel=CHANNEL, message_ts=message["ts"], thread_ts=root
        )
        assert answer.status_code == 200

    def said(self, root: str, needle: str, timeout: float = 60) -> str:
        def find() -> str | None:
            return next((t for m in self.s.slack.messages(CHANNEL, root) if needle in (t := m.get("text", ""))), None)

        try:
            return self.s.wait(find, timeout=timeout, message=f"{needle!r} in the thread")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- the thread:\n{self.s.thread_text(root)}") from None

    def all_text(self) -> str:
        """Every thread, ephemeral and log line there is: where a token must not be."""
        sent = [str(call.params) for call in self.s.slack.calls]  # every Web API call, whatever the method
        logs = [self.s.log_of(n) for n in ("w1", "bot")]
        return "\n".join([*sent, *logs])


def forge_config(forge: ForgeServer, *lines: str, keys: str = "") -> list[str]:
    return [
        "forges:",
        f"  '{forge.host}': {{kind: {forge.kind}{keys}}}",
        "pullRequest: {labels: [mm], followChecksMinutes: 1}",
        *lines,
    ]


# What a stack is given about its forge: its config lines and the worker's environment (besides the CA's).
Settings = Callable[[ForgeServer], tuple[list[str], dict[str, str]]]


def with_token(*extra: str, keys: str = "") -> Settings:
    """The forge as a kind of its own, its token in the kind's variable (the common case)."""
    return lambda forge: (forge_config(forge, *extra, keys=keys), {TOKEN_ENVS[forge.kind]: TOKEN})


@contextmanager
def forged(
    tmp: Path,
    pg: str,
    redis: str,
    kind: Kind,
    path: str,
    settings: Settings | None = None,
    tokens: dict[str, list[str] | None] | None = None,
) -> Iterator[Forged]:
    forge = ForgeServer(kind, tmp / "forge", {TOKEN: [path]} if tokens is None else tokens).start()
    try:
        clone = forge.add_repo(path)
        lines, env = (settings or with_token())(forge)
        text = config(f"{{yolo: true, repo: '{clone}', approvers: [{BOB}]}}", *lines)
        with stack(tmp, pg, redis, config=text, extra_env=forge.ca_env() | env) as s:
            s.model.always(policy)
            for user, name in ((BOB, "bob"), (ALICE, "alice")):
                s.slack.add_user(user, name)
            s.start_worker()
            base = s.start_bot()
            with SlackEventSender(base, SECRET, response_url=s.slack.response_url) as sender:
                yield Forged(s, sender, forge, path, clone)
        assert not forge.take_unsupported()
    finally:
        forge.stop()


def test_a_thread_keeps_one_pull_request_opened_by_an_approver_and_follows_its_checks(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    with forged(tmp_path, fresh_pg_url, own_redis.url, "github", "acme/app") as f:
        s, forge = f.s, f.forge
        request = "<@U0BOT> write: notes.txt"
        root = s.slack.add_message(CHANNEL, request, ALICE)["ts"]  # as Slack keeps it: its link is asked for
        f.sender.app_mention(request, channel=CHANNEL, user=ALICE, ts=root)
        offer = f.offer(root)
        assert "or open a pull request" in offer["text"]
        assert set(buttons(offer)) == {"push", "pull_request"}

        # Alice wrote in this thread: like an approval of her own request, her click is refused.
        f.click(offer, "pull_request", ALICE, root)
        refused = s.wait(lambda: [e for e in s.slack.ephemerals if e.get("to_user") == ALICE], message="refused")
        assert "Only this channel's approvers may open a thread's pull request" in refused[0]["text"]
        assert forge.pulls("acme/app") == []

        f.click(offer, "pull_request", BOB, root)
        opened = f.said(root, "opened <")
        [pull] = forge.pulls("acme/app")
        assert opened.startswith(
            f"🔀 <@{BOB}> opened <{pull['url']}|pull request #{pull['number']}> into `main` (draft)"
        )
        branch = f"mm/thread-{root.replace('.', '-')}"
        assert (pull["head"], pull["base"], pull["state"], pull["draft"]) == (branch, "main", "open", True)
        assert pull["labels"] == ["mm"]
        body = pull["body"]
        assert "> write: notes.txt" in body  # what was asked
        assert f"/archives/{CHANNEL}/p{root.replace('.', '')}" in body  # the thread's link
        assert "Asked by alice (U0ALICE); approved by bob (U0BOB)." in body
        assert "notes.txt | 1 +" in body  # the diff stat
        assert body.rstrip().endswith("-->") and "<!-- mm:thread:" in body
        first_head = pull["head_sha"]

        # A second turn's changes go to the same pull request, offered as an update.
        f.sender.app_mention("<@U0BOT> write: more.txt", channel=CHANNEL, user=ALICE, thread_ts=root)
        second = f.offer(root, 2)
        assert f"add them to <{pull['url']}|#{pull['number']}>" in second["text"]
        assert set(buttons(second)) == {"pull_request"}
        f.click(second, "pull_request", BOB, root)
        f.said(root, "updated <")
        [pull] = forge.pulls("acme/app")  # still one
        assert pull["head_sha"] != first_head and "more.txt  | 1 +" in pull["body"]

        # Its checks: followed by housekeeping, one line when they have all finished.
        forge.set_checks("acme/app", pull["head_sha"], [("test", "success"), ("lint", "failure")])
        failed = f.said(root, "Checks failed")
        assert failed == f"❌ Checks failed on <{pull['url']}|#{pull['number']}>: `lint`."
        forge.set_review("acme/app", pull["number"], "carol", "approved")

        # `@mm pr` with a pull request: its status, for anyone in the channel.
        f.sender.app_mention("<@U0BOT> pr", channel=CHANNEL, user=ALICE, thread_ts=root)
        status = f.said(root, "review: approved")
        assert "open (draft)" in status and "checks: 1 passed, 1 failing (lint)" in status

        # The model's sandbox has no token: `env` there shows none.
        f.sender.app_mention("<@U0BOT> run: env", channel=CHANNEL, user=ALICE, thread_ts=root)
        s.wait(lambda: "PATH=" in s.thread_text(root), message="env's output")
        assert TOKEN not in f.all_text()
        # The worker's API calls and pushes used it (git asks without one first: the forge's 401 asks for it).
        assert {token for _m, _p, token in forge.requests} == {TOKEN, None}
        assert all(token == TOKEN for _m, path, token in forge.requests if "/api/" in path)


def test_a_job_keeps_one_pull_request_updated_left_alone_and_opened_anew(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    job = (
        "jobs:\n  - {name: notes, schedule: '0 4 * * *', channel: "
        + CHANNEL
        + ", prompt: 'write: notes.txt', yolo: true, push: {pr: true}}"
    )
    with forged(tmp_path, fresh_pg_url, own_redis.url, "gitlab", "acme/team/app", with_token(job)) as f:
        s, forge = f.s, f.forge
        first = finished(s, run_now(s, "notes"))
        assert first.status == "succeeded", first.summary
        [mr] = forge.pulls("acme/team/app")
        assert (mr["head"], mr["base"], mr["state"]) == ("mm/notes", "main", "open")
        assert f"<{mr['url']}|pull request !{mr['number']}>" in first.summary
        assert "The scheduled job `notes`" in mr["body"] and "<!-- mm:job:notes -->" in mr["body"]

        # A second run with other changes: the same merge request, its branch rebuilt from the base.
        s.model.always(writes("notes.txt", "second run\n"))
        second = finished(s, run_now(s, "notes"))
        assert second.status == "succeeded", second.summary
        [mr2] = forge.pulls("acme/team/app")
        assert mr2["number"] == mr["number"] and mr2["head_sha"] != mr["head_sha"]
        assert f"Updated <{mr['url']}|pull request !{mr['number']}>" in second.summary

        # A run that changes nothing leaves it alone, and says so.
        s.model.always(lambda _request: Reply(text="nothing to do"))
        third = finished(s, run_now(s, "notes"))
        assert third.status == "succeeded", third.summary
        assert f"No changes in this run: <{mr['url']}|!{mr['number']}> was left as it is." in third.summary
        [mr3] = forge.pulls("acme/team/app")
        assert mr3["head_sha"] == mr2["head_sha"]

        # A worker stopped mid-push: the branch holds the commit it was sending, which its record names
        # (pushing_sha, written before the push left): mm's own, so the next run replaces it.
        sent = new_branch(forge, "mm/notes", "acme/team/app")
        with s.engine.begin() as conn:
            conn.execute(update(PullRequestRecord).values(pushing_sha=sent))
        s.model.always(writes("notes.txt", "after a stop\n"))
        resumed = finished(s, run_now(s, "notes"))
        assert resumed.status == "succeeded", resumed.summary
        assert forge.pulls("acme/team/app")[0]["head_sha"] not in (sent, mr2["head_sha"])

        # A person pushes to the merge request's branch: the next run does not push over their commit.
        theirs = new_branch(forge, "mm/notes", "acme/team/app")
        s.model.always(writes("notes.txt", "fourth run\n"))
        fourth = finished(s, run_now(s, "notes"))
        assert fourth.status == "failed" and "has commits mm did not push" in fourth.summary, fourth.summary
        assert forge.pulls("acme/team/app")[0]["head_sha"] == theirs

        # Closed on the forge: the next run with changes opens a new one.
        forge.close("acme/team/app", mr["number"])
        fifth = finished(s, run_now(s, "notes"))
        assert fifth.status == "succeeded", fifth.summary
        pulls = forge.pulls("acme/team/app")
        assert [p["state"] for p in pulls] == ["closed", "open"]
        assert f"pull request !{pulls[1]['number']}" in fifth.summary

        # An open merge request no record knows (the records lost): its head may be anyone's, so nothing is
        # pushed over it, and the run says how to start afresh.
        with s.engine.begin() as conn:
            conn.execute(delete(PullRequestRecord))
        s.model.always(writes("notes.txt", "sixth run\n"))
        sixth = finished(s, run_now(s, "notes"))
        assert sixth.status == "failed" and "close the pull request (or delete the branch)" in sixth.summary
        assert forge.pulls("acme/team/app")[1]["head_sha"] == pulls[1]["head_sha"]
        assert TOKEN not in f.all_text()


def writes(path: str, content: str) -> Callable[[dict[str, Any]], Reply]:
    def answer(request: dict[str, Any]) -> Reply:
        if request["messages"][-1]["role"] == "tool":
            return Reply(text="written")
        return Reply(tool_calls=[ToolCall("write_file", {"path": path, "content": content})])

    return answer


def test_pr_opens_with_its_title_then_shows_the_status_on_gitea(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    with forged(tmp_path, fresh_pg_url, own_redis.url, "gitea", "acme/app") as f:
        forge = f.forge
        root = f.sender.new_ts()
        f.sender.app_mention("<@U0BOT> write: notes.txt", channel=CHANNEL, user=ALICE, ts=root)
        f.offer(root)
        f.sender.app_mention("<@U0BOT> pr Add the notes", channel=CHANNEL, user=BOB, thread_ts=root)
        opened = f.said(root, "opened <")
        [pull] = forge.pulls("acme/app")
        assert pull["title"] == "WIP: Add the notes" and pull["draft"] is True  # Gitea's draft
        assert f"opened <{pull['url']}|pull request #{pull['number']}> into `main` (draft): Add the notes" in opened
        f.sender.app_mention("<@U0BOT> pr", channel=CHANNEL, user=ALICE, thread_ts=root)
        assert "no checks" in f.said(root, "no review yet")
        assert TOKEN not in f.all_text()


def test_a_forge_without_a_token_names_the_variable_to_set(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    """The forge's own variable is unset: git clones with MM_GIT_TOKEN, and the pull request says what to set."""
    forge_path = "acme/app"

    def settings(forge: ForgeServer) -> tuple[list[str], dict[str, str]]:
        return forge_config(forge, keys=", tokenEnv: MM_ACME"), {"MM_GIT_TOKEN": TOKEN}

    with forged(tmp_path, fresh_pg_url, own_redis.url, "github", forge_path, settings) as f:
        forge = f.forge
        root = f.sender.new_ts()
        f.sender.app_mention("<@U0BOT> write: notes.txt", channel=CHANNEL, user=ALICE, ts=root)
        f.offer(root)
        # No token and no App for this host: the thread says which variable to set.
        f.sender.app_mention("<@U0BOT> pr", channel=CHANNEL, user=BOB, thread_ts=root)
        said = f.said(root, "No token for")
        assert "set MM_ACME in the worker's environment" in said and forge.pulls(forge_path) == []


def test_a_rate_limited_pull_request_opens_after_the_reset_and_a_protected_base_is_refused(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    with forged(tmp_path, fresh_pg_url, own_redis.url, "github", "acme/app") as f:
        forge = f.forge
        root = f.sender.new_ts()
        f.sender.app_mention("<@U0BOT> write: notes.txt", channel=CHANNEL, user=ALICE, ts=root)
        f.offer(root)
        forge.limit_rate(datetime.now(UTC) + timedelta(seconds=3))
        f.sender.app_mention("<@U0BOT> pr", channel=CHANNEL, user=BOB, thread_ts=root)
        later = f.said(root, "tried again after")
        assert "rate limit" in later
        opened = f.said(root, "opened <", timeout=90)  # housekeeping, after the reset
        assert len(forge.pulls("acme/app")) == 1 and "pull request #" in opened

        # A protected base: the forge's own words.
        root2 = f.sender.new_ts()
        forge.protect("acme/app", "main", "Pull requests into main are not allowed from bots.")
        f.sender.app_mention("<@U0BOT> write: other.txt", channel=CHANNEL, user=ALICE, ts=root2)
        f.offer(root2)
        f.sender.app_mention("<@U0BOT> pr", channel=CHANNEL, user=BOB, thread_ts=root2)
        refused = f.said(root2, "was not opened")
        assert "Pull requests into main are not allowed from bots." in refused
        assert len(forge.pulls("acme/app")) == 1


def test_a_github_app_signs_in_as_its_installation_and_its_tokens_are_never_shown(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    key: list[str] = []

    def as_app(forge: ForgeServer) -> tuple[list[str], dict[str, str]]:
        app_id, pem = forge.new_app()
        key.append(pem)
        app = f"app: {{id: {app_id}, privateKeyEnv: MM_TEST_APP_KEY}}"
        return ["forges:", f"  '{forge.host}': {{kind: github, {app}}}"], {"MM_TEST_APP_KEY": pem}

    with forged(tmp_path, fresh_pg_url, own_redis.url, "github", "acme/app", as_app, tokens={}) as f:
        root = f.sender.new_ts()
        f.sender.app_mention("<@U0BOT> write: notes.txt", channel=CHANNEL, user=ALICE, ts=root)
        f.click(f.offer(root), "pull_request", BOB, root)
        f.said(root, "opened <")
        [pull] = f.forge.pulls("acme/app")
        assert pull["author"] != ""  # opened as the App's installation
        tokens = {token for _m, _p, token in f.forge.requests if token}
        assert tokens and all(t.startswith("ghs_") or t.count(".") == 2 for t in tokens)
        seen = f.all_text()
        assert key[0].splitlines()[1] not in seen
        assert not [t for t in tokens if t in seen]  # the installation tokens: used, never shown


def test_a_host_without_a_forge_names_the_key_to_set(tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis) -> None:
    def no_forge(forge: ForgeServer) -> tuple[list[str], dict[str, str]]:
        return [], {"MM_GIT_TOKEN": TOKEN}

    with forged(tmp_path, fresh_pg_url, own_redis.url, "github", "acme/app", no_forge) as f:
        root = f.sender.new_ts()
        f.sender.app_mention("<@U0BOT> write: notes.txt", channel=CHANNEL, user=ALICE, ts=root)
        offer = f.offer(root)
        assert set(buttons(offer)) == {"push"}  # no forge known: a branch only
        f.sender.app_mention("<@U0BOT> pr", channel=CHANNEL, user=BOB, thread_ts=root)
        said = f.said(root, "No forge is configured")
        assert f"forges.{f.forge.host}.kind" in said
