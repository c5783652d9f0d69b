"""`mm-bot doctor` against the real services: the Slack emulator, the scripted model server, Redis, SQLite and
PostgreSQL. Each broken part gives its own FAIL line with the fix, and no secret is ever printed."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from slack_sdk.oauth.installation_store import Installation

from chatops import db
from chatops.config import load_config
from commands.doctor import main as doctor
from mm_testkit.fixtures_kit import path_without
from mmbot_helpers import CONFIG_ENV, clean_env, free_port, mm_bot
from playground.model_server import ModelServer
from playground.slack_api import SlackEmulator
from slackio.installations import installations

SIGNING_SECRET = "signing-secret-never-printed"
MODEL_KEY = "sk-model-key-never-printed"


@pytest.fixture
def bwrap_on_path(tmp_path: Path) -> Path:
    """A `bwrap` the sandbox check finds (it looks for the program; the sandbox's own tests run the real one)."""
    fake = tmp_path / "fake-bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    return fake


@pytest.fixture
def healthy(
    sqlite_url: str, redis_url: str, slack: SlackEmulator, model_server: ModelServer, bwrap_on_path: Path
) -> dict[str, str]:
    """An environment in which every check passes."""
    db.migrate(sqlite_url)
    return {
        "DATABASE_URL": sqlite_url,
        "CELERY_BROKER_URL": redis_url,
        "MM_MODEL_URL": model_server.url,
        "MM_MODEL": "test-model",
        "SLACK_API_URL": slack.url,
        "SLACK_BOT_TOKEN": slack.bot_token,
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "PATH": f"{bwrap_on_path.parent}{os.pathsep}{os.environ['PATH']}",
    }


def run_doctor(
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    config: str | None = None,
) -> tuple[int, dict[str, str], str]:
    """Doctor in this process (it is a few HTTP calls): exit code, {check: line}, and the whole output."""
    monkeypatch.chdir(tmp_path)
    for name in CONFIG_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = doctor(config)
    out = capsys.readouterr().out
    lines = {line.split()[1]: line for line in out.splitlines() if line[:2] in ("ok", "FA")}
    return code, lines, out


@pytest.mark.process
def test_all_ok_through_the_real_command(
    tmp_path: Path, healthy: dict[str, str], slack: SlackEmulator, bwrap_on_path: Path
) -> None:
    result = mm_bot("doctor", env=clean_env(**healthy), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["ok", "config"],
        ["ok", "database"],
        ["ok", "broker"],
        ["ok", "model"],
        ["ok", "slack"],
        ["ok", "sandbox"],
        ["ok", "network"],
    ]
    assert f"(at head {db.head_revision()})" in lines[1]
    assert "serves test-model" in lines[3]
    assert lines[5] == f"ok   sandbox   bubblewrap at {bwrap_on_path}"
    assert lines[6] == "ok   network   allow: registries"
    assert slack.bot_token not in result.stdout and SIGNING_SECRET not in result.stdout
    assert slack.calls_to("auth.test")


def test_model_server_stopped(tmp_path, healthy, model_server, monkeypatch, capsys) -> None:
    model_server.stop()
    code, lines, _ = run_doctor(healthy, monkeypatch, capsys, tmp_path)
    assert code == 1
    assert lines["model"].startswith("FAIL model")
    assert "unreachable: connection refused — start your model server or set MM_MODEL_URL" in lines["model"]
    assert all(line.startswith("ok") for name, line in lines.items() if name != "model")


def test_wrong_model_name(tmp_path, healthy, monkeypatch, capsys) -> None:
    code, lines, _ = run_doctor(healthy | {"MM_MODEL": "ai/nope"}, monkeypatch, capsys, tmp_path)
    assert code == 1
    assert 'does not serve model "ai/nope" (it has: test-model) — set model.name or MM_MODEL' in lines["model"]


def test_model_key_rejected_and_never_printed(tmp_path, healthy, monkeypatch, capsys) -> None:
    (tmp_path / "mm.yaml").write_text("model:\n  apiKeyEnv: MODEL_API_KEY\n")
    with ModelServer(api_key="the-right-key") as guarded:
        env = healthy | {"MM_MODEL_URL": guarded.url, "MODEL_API_KEY": MODEL_KEY}
        code, lines, out = run_doctor(env, monkeypatch, capsys, tmp_path)
        assert code == 1
        assert "rejected the API key (HTTP 401) — check the key in MODEL_API_KEY" in lines["model"]
        assert MODEL_KEY not in out

        code, lines, _ = run_doctor(env | {"MODEL_API_KEY": "the-right-key"}, monkeypatch, capsys, tmp_path)
        assert code == 0 and lines["model"].startswith("ok")


def test_slack_token_missing_or_rejected(tmp_path, healthy, monkeypatch, capsys) -> None:
    env = {k: v for k, v in healthy.items() if k != "SLACK_BOT_TOKEN"}
    code, lines, _ = run_doctor(env, monkeypatch, capsys, tmp_path)
    assert code == 1 and "SLACK_BOT_TOKEN is not set" in lines["slack"] and "docs/slack-app.md" in lines["slack"]

    wrong = "xoxb-wrong-token-never-printed"
    code, lines, out = run_doctor(healthy | {"SLACK_BOT_TOKEN": wrong}, monkeypatch, capsys, tmp_path)
    assert code == 1 and "rejected SLACK_BOT_TOKEN (invalid_auth)" in lines["slack"]
    assert wrong not in out


def test_slack_token_ok_but_signing_secret_missing(tmp_path, healthy, monkeypatch, capsys) -> None:
    env = {k: v for k, v in healthy.items() if k != "SLACK_SIGNING_SECRET"}
    code, lines, _ = run_doctor(env, monkeypatch, capsys, tmp_path)
    assert code == 1
    assert lines["slack"] == (
        f"FAIL slack     {healthy['SLACK_API_URL']} @mm in Test Team; SLACK_SIGNING_SECRET is not set — export it "
        "(the Slack app's secrets: see docs/slack-app.md)"
    )


@pytest.mark.process
def test_every_missing_secret_is_named_in_one_run(tmp_path: Path, healthy: dict[str, str]) -> None:
    (tmp_path / "mm.yaml").write_text("model:\n  apiKeyEnv: MODEL_API_KEY\n")
    env = {k: v for k, v in healthy.items() if k not in ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET")}
    result = mm_bot("doctor", env=clean_env(**env), cwd=tmp_path)
    assert result.returncode == 1
    lines = {line.split()[1]: line for line in result.stdout.splitlines()}
    # The unset key stops every other command at start-up; doctor names it with the others, and checks the rest.
    assert lines["config"].startswith("ok") and lines["model"].startswith("ok")
    assert lines["slack"] == (
        "FAIL slack     SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET and MODEL_API_KEY are not set — export them (the "
        "Slack app's secrets: see docs/slack-app.md; MODEL_API_KEY: the model endpoint's API key, named by "
        "model.apiKeyEnv)"
    )


@pytest.mark.process
@pytest.mark.parametrize("mode", ["auto", "bwrap"])
def test_sandbox_that_needs_bubblewrap_fails_without_it(tmp_path: Path, healthy: dict[str, str], mode: str) -> None:
    (tmp_path / "mm.yaml").write_text(f"sandbox: {mode}\n")
    result = mm_bot("doctor", env=clean_env(**healthy | {"PATH": path_without("bwrap", tmp_path)}), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines()[-2] == (
        f"FAIL sandbox   a worker refuses to start: bubblewrap is not installed, and `sandbox: {mode}` needs it to "
        "confine bash commands: install bubblewrap (apt-get install bubblewrap), or set `sandbox: none` to run them "
        "unsandboxed"
    )


@pytest.mark.process
def test_sandbox_none_is_ok_with_a_warning(tmp_path: Path, healthy: dict[str, str]) -> None:
    (tmp_path / "mm.yaml").write_text("sandbox: none\n")
    result = mm_bot("doctor", env=clean_env(**healthy), cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines()[-2] == (
        "ok   sandbox   warning: `sandbox: none`: bash commands run unsandboxed, with this worker's access to files "
        "and the network (only the resource limits and the scrubbed environment apply)"
    )


@pytest.mark.process
def test_network_open_without_slirp4netns_fails_and_an_unset_credential_is_a_warning(
    tmp_path: Path, healthy: dict[str, str]
) -> None:
    (tmp_path / "mm.yaml").write_text("network: open\n")
    path = path_without("slirp4netns", tmp_path)
    result = mm_bot("doctor", env=clean_env(**healthy | {"PATH": path}), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines()[-1] == (
        "FAIL network   network is open, but slirp4netns is not installed on this worker: sandboxed commands run "
        "without network (apt-get install slirp4netns)"
    )
    # A channel's own `open` needs the parts as much as the top level's.
    (tmp_path / "mm.yaml").write_text("channels: {C0123ABCD: {network: open}}\n")
    result = mm_bot("doctor", env=clean_env(**healthy | {"PATH": path}), cwd=tmp_path)
    assert result.returncode == 1 and result.stdout.splitlines()[-1].startswith("FAIL network   network is open, but")
    (tmp_path / "mm.yaml").write_text(
        "network: {allow: [registries, github.com], credentials: [{hosts: [github.com], tokenEnv: MM_GH}]}\n"
        "channels: {C0123ABCD: {network: 'off'}}\n"
    )
    result = mm_bot("doctor", env=clean_env(**healthy), cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines()[-1] == (
        "ok   network   allow: registries, github.com (1 channel or job with their own); warning: MM_GH unset "
        "here: a worker without it refuses the hosts it is the credential for"
    )


def test_database_not_migrated(tmp_path, healthy, monkeypatch, capsys) -> None:
    empty = f"sqlite:///{tmp_path / 'empty.sqlite3'}"
    code, lines, _ = run_doctor(healthy | {"DATABASE_URL": empty}, monkeypatch, capsys, tmp_path)
    assert code == 1 and "has no schema yet" in lines["database"] and "run `mm-bot migrate`" in lines["database"]


def test_database_and_broker_unreachable_with_passwords_masked(tmp_path, healthy, monkeypatch, capsys) -> None:
    env = healthy | {
        "DATABASE_URL": f"postgresql://mm:db-password-never-printed@127.0.0.1:{free_port()}/mm",
        "CELERY_BROKER_URL": f"redis://:redis-password-never-printed@127.0.0.1:{free_port()}/0",
    }
    code, lines, out = run_doctor(env, monkeypatch, capsys, tmp_path)
    assert code == 1
    assert "postgresql://mm:***@127.0.0.1" in lines["database"] and "set DATABASE_URL" in lines["database"]
    assert "redis://:***@127.0.0.1" in lines["broker"] and "set CELERY_BROKER_URL" in lines["broker"]
    assert "never-printed" not in out


@pytest.mark.postgres
@pytest.mark.parametrize(
    "url",
    [
        "http://mm:model-password-never-printed@127.0.0.1:port/v1",  # httpx: InvalidURL, not an HTTPError
        "http://mm:model-password-never-printed@127.0.0.1:99999/v1",
        "gopher://mm:model-password-never-printed@127.0.0.1/v1",
    ],
)
def test_unusable_model_url_is_a_fail_line_not_a_crash(tmp_path, healthy, monkeypatch, capsys, url) -> None:
    code, lines, out = run_doctor(healthy | {"MM_MODEL_URL": url}, monkeypatch, capsys, tmp_path)
    assert code == 1 and lines["model"].startswith("FAIL model")
    assert "set MM_MODEL_URL" in lines["model"] and lines["slack"].startswith("ok")  # the checks after it ran
    assert "never-printed" not in out


@pytest.mark.postgres
def test_a_model_port_out_of_range_is_refused_before_anything_is_asked(tmp_path, healthy, monkeypatch, capsys) -> None:
    """httpx asks the port 99999 wraps to (34463), where another server may answer as a model: the workers'
    client refuses such a URL, and so does doctor, before any request."""
    code, lines, _ = run_doctor(healthy | {"MM_MODEL_URL": "http://127.0.0.1:99999/v1"}, monkeypatch, capsys, tmp_path)
    assert code == 1 and "is not a usable URL" in lines["model"] and "out of range" in lines["model"], lines


def test_postgres_at_head(tmp_path, healthy, fresh_pg_url, monkeypatch, capsys) -> None:
    db.migrate(fresh_pg_url)
    code, lines, _ = run_doctor(healthy | {"DATABASE_URL": fresh_pg_url}, monkeypatch, capsys, tmp_path)
    assert code == 0 and f"(at head {db.head_revision()})" in lines["database"]


def test_bad_config_fails_the_config_check_with_file_and_line(tmp_path, healthy, monkeypatch, capsys) -> None:
    (tmp_path / "mm.yaml").write_text("maxTurns: -1\nbashTol: true\n")
    code, lines, out = run_doctor(healthy, monkeypatch, capsys, tmp_path)
    assert code == 1
    assert list(lines) == ["config"]  # the other checks need a config
    assert "mm.yaml:1: maxTurns" in out and 'mm.yaml:2: bashTol: unknown key (did you mean "bashTool"?)' in out


@pytest.mark.process
def test_installed_in_many_workspaces_it_lists_the_installations_and_the_sections_none_answers(
    tmp_path, healthy, slack, monkeypatch, capsys
) -> None:
    oauth = {k: v for k, v in healthy.items() if k != "SLACK_BOT_TOKEN"} | {
        "SLACK_CLIENT_ID": slack.client_id,
        "SLACK_CLIENT_SECRET": "client-secret-never-printed",
    }
    # Served by nobody yet: the config names no workspace.
    code, lines, _ = run_doctor(oauth, monkeypatch, capsys, tmp_path)
    assert code == 1 and "serves no Slack workspace" in lines["slack"]

    config = tmp_path / "mm.yaml"
    config.write_text("teams:\n  T0ALPHA: {}\n  T0BETA: {}\n")
    code, lines, _ = run_doctor(oauth, monkeypatch, capsys, tmp_path, str(config))
    assert code == 1 and "installed in no workspace yet" in lines["slack"] and "/slack/install" in lines["slack"]

    slack.add_team("T0ALPHA", "Alpha")
    answer = slack.install(team="T0ALPHA")
    store = installations(load_config(str(config), oauth)).store
    saved = Installation(
        app_id=answer["app_id"],
        team_id="T0ALPHA",
        team_name="Alpha",
        bot_token=answer["access_token"],
        bot_id="B0ALPHA",
        bot_user_id=answer["bot_user_id"],
        user_id="U0INSTALLER",
        installed_at=1_790_000_000.0,
    )
    asyncio.run(store.async_save(saved))
    code, lines, out = run_doctor(oauth, monkeypatch, capsys, tmp_path, str(config))
    assert "installed in 1: Alpha (T0ALPHA, since 2026-09-21)" in lines["slack"], lines["slack"]
    assert "no installation answers teams.T0BETA" in lines["slack"]
    assert "client-secret-never-printed" not in out and answer["access_token"] not in out
