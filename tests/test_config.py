"""Configuration: every problem is reported as file:line: key: what was expected; the environment fills in
secrets and endpoints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chatops.config import ConfigError, example_config, load_config
from chatops.secrets import secrets_of
from config_support import problems as _problems
from config_support import write as _write


def test_yaml_syntax_error(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """
        model:
          url: http://127.0.0.1:1/v1
           name: ai/gemma3
        """,
    )
    assert problems == ["3: invalid YAML: mapping values are not allowed here"]


def test_unknown_key_with_suggestion(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """
        maxTurns: 10
        yoloo: false
        channels:
          default: {repo: https://git.example.com/a.git, brnch: main}
        """,
    )
    assert problems == [
        '2: yoloo: unknown key (did you mean "yolo"?)',
        '4: channels.default.brnch: unknown key (did you mean "branch"?)',
    ]


def test_unknown_key_without_a_close_match_lists_the_valid_ones(tmp_path: Path) -> None:
    assert _problems(tmp_path, "approvals: {zzz: 1}\n") == [
        "1: approvals.zzz: unknown key (expected one of: requester_can_approve, timeout, remindAfter, escalateAfter, "
        "escalateTo, policies)"
    ]


def test_secret_literal_is_an_unknown_key(tmp_path: Path) -> None:
    # Secrets come from the environment only: a token written in the file is refused, not used.
    problems = _problems(tmp_path, "token: xoxb-123\nmodel:\n  apiKey: sk-123\n")
    assert problems == [
        "1: token: unknown key (docs/configuration.md lists the keys)",
        '3: model.apiKey: unknown key (did you mean "apiKeyEnv"?)',
    ]


def test_wrong_types(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """
        yolo: "no"
        maxOutput: 20k
        model:
          url: 8080
        watchdogTimeout: soon
        sandbox: docker
        maxTurns: 0
        """,
    )
    assert problems == [
        "1: yolo: expected true or false, got a string",
        "2: maxOutput: expected an integer, got a string",
        "4: model.url: expected a string, got an integer",
        "5: watchdogTimeout: expected a duration such as 30s, 5m or 1h",
        "6: sandbox: expected one of 'auto', 'bwrap' or 'none', got \"docker\"",
        "7: maxTurns: expected a number >= 1, got 0",
    ]


def test_nested_wrong_type_in_a_list_and_a_mapping(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """
        channels:
          C0123ABCD:
            repo: https://git.example.com/a.git
            approvers: U01ADMIN
          C0456EFGH:
            approvers: [U01ADMIN, alice]
        jobs:
          - name: nightly
            schedule: "0 3 * * *"
            channel: C0123ABCD
            prompt: check
          - name: weekly
            schedule: "0 4 * * 1"
            channel: C0123ABCD
            prompt: [not, a, string]
        lsp:
          servers:
            pylsp: {command: pylsp, extensions: .py}
        """,
    )
    assert problems == [
        "4: channels.C0123ABCD.approvers: expected a list of user or group ids, got a string",
        '6: channels.C0456EFGH.approvers: expected a list of user or group ids (U…, W… or S…), got "alice"',
        "15: jobs[1].prompt: expected a string, got a list",
        "18: lsp.servers.pylsp.extensions: expected a list, got a string",
    ]


def test_missing_required_key_in_a_job(tmp_path: Path) -> None:
    problems = _problems(tmp_path, "jobs:\n  - name: nightly\n    schedule: '0 3 * * *'\n    channel: C0123ABCD\n")
    assert problems == ["2: jobs[0]: a job needs a prompt, or a skill to follow (or both)"]


def test_a_jobs_agent_skill_and_push_are_checked(tmp_path: Path) -> None:
    job = "jobs:\n  - name: nightly\n    schedule: '0 3 * * *'\n    channel: C0123ABCD\n"
    assert _problems(tmp_path, job + "    skill: deps\n    agent: reviewer\n    maxFailures: 0\n") == [
        "5: jobs[0].skill: a skill needs `skillsDir`, where the skills are",
        "6: jobs[0].agent: no mmConfigs entry is named 'reviewer' (none is configured)",
        "7: jobs[0].maxFailures: expected a number >= 1, got 0",
    ]
    pushes = (
        ("    push: {remote: 'https://bot:s3cret@git.example.com/a.git'}\n", "credentials do not go in the remote"),
        ("    push: {branch: 'mm/{job}/../x'}\n", "expected a git branch name"),
        ("    push: {branch: 'a b'}\n", "expected a git branch name"),
        ("    push: {branch: 'chores/{job}-{date}'}\n", "expected {run} in the branch (each run pushes a branch"),
        ("    push: yes please\n", "expected true, false or a mapping of remote and branch"),
    )
    for text, problem in pushes:
        [found] = _problems(tmp_path, job + "    prompt: bump deps\n" + text)
        assert problem in found and "s3cret" not in found, found
    for name in ("a..b", "x.lock", ".hidden"):  # fine for a name, not for the branches it names
        [found] = _problems(tmp_path, job.replace("nightly", name) + "    prompt: p\n")
        assert "could name a git branch" in found, found
    good = job + "    prompt: bump deps\n    timezone: Europe/Paris\n    timeLimit: 10m\n    push: true\n"
    [config] = load_config(_write(tmp_path, good)).service.jobs
    assert (config.timeLimit, config.enabled, config.maxFailures) == (600.0, True, 3)
    assert config.push is not None and (config.push.remote, config.push.branch) == (None, "mm/{job}/{date}-{run}")


def test_missing_secret_env_var(tmp_path: Path) -> None:
    text = "yolo: false\nmodel:\n  apiKeyEnv: MY_MODEL_KEY\n"
    assert _problems(tmp_path, text) == ["3: model.apiKeyEnv: the environment variable MY_MODEL_KEY is not set"]
    config = load_config(_write(tmp_path, text), {"MY_MODEL_KEY": "sk-test"})
    assert config.model_api_key == "sk-test"


def test_duplicate_lsp_extension(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """
        lsp:
          servers:
            a: {command: pylsp, extensions: [.py]}
            b:
              command: jedi-language-server
              extensions: [.pyi, .py]
        """,
    )
    assert problems == ["6: lsp.servers.b.extensions: .py is already served by a"]


def test_bad_cron_and_timezone_and_channel(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """
        jobs:
          - name: nightly
            schedule: "61 3 * * *"
            timezone: Mars/Olympus
            channel: general
            prompt: check the dependencies
          - name: nightly
            schedule: "0 3 * * *"
            timezone: ../../etc/passwd
            channel: C0123ABCD
            prompt: again
        """,
    )
    assert problems == [
        '3: jobs[0].schedule: expected a cron expression of 5 fields such as "0 3 * * 1-5", got "61 3 * * *"',
        '4: jobs[0].timezone: unknown time zone "Mars/Olympus" (expected an IANA name such as Europe/Paris)',
        "5: jobs[0].channel: expected a channel id such as C0123ABCD, got 'general'",
        "7: jobs[1].name: another job is already named 'nightly'",
        '9: jobs[1].timezone: unknown time zone "../../etc/passwd" (expected an IANA name such as Europe/Paris)',
    ]


def test_duplicate_key_and_bad_channel_key(tmp_path: Path) -> None:
    problems = _problems(tmp_path, "yolo: true\nchannels:\n  general: {}\nyolo: false\n")
    assert problems == [
        "3: channels.general: expected `default` or a channel id such as C0123ABCD as the key",
        "4: yolo: duplicate key (first set on line 1)",
    ]


def test_keys_must_be_strings_and_values_not_null(tmp_path: Path) -> None:
    problems = _problems(tmp_path, "channels:\n  123: {}\nmodel: null\n")
    assert problems == [
        "2: channels[123]: expected a string as the key, got an integer",
        "3: model: expected a mapping of keys, got nothing (null)",
    ]
    # Where the model has fields (the top level, `model`), pydantic words it differently: the same sentence.
    assert _problems(tmp_path, "1: x\nmodel:\n  2.5: y\n") == [
        "1: [1]: expected a string as the key, got an integer",
        "3: model.2.5: expected a string as the key, got a number",
    ]


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    assert _problems(tmp_path, "- yolo\n") == ["1: expected a mapping of keys at the top level, got a list"]


def test_env_overrides_and_defaults(tmp_path: Path) -> None:
    path = _write(tmp_path, "model: {url: http://127.0.0.1:1/v1, name: small}\nworkspaces: {root: ws}\n")
    config = load_config(
        path,
        {
            "MM_MODEL_URL": "http://127.0.0.1:2/v1",
            "MM_MODEL": "other",
            "DATABASE_URL": "postgresql://postgres@127.0.0.1/mm",
            "CELERY_BROKER_URL": "",  # empty means unset
            "SLACK_API_URL": "http://127.0.0.1:3/api/",
            "SLACK_BOT_TOKEN": "xoxb-1",
        },
    )
    assert (config.agent.model.url, config.agent.model.name) == ("http://127.0.0.1:2/v1", "other")
    assert config.database_url == "postgresql://postgres@127.0.0.1/mm"
    assert config.broker_url == "redis://localhost:6379/0"
    assert config.slack_api_url == "http://127.0.0.1:3/api/"
    assert config.workspaces_root == Path("ws").absolute()
    assert config.missing_slack_secrets(socket_mode=False) == ["SLACK_SIGNING_SECRET"]
    assert config.missing_slack_secrets(socket_mode=True) == ["SLACK_APP_TOKEN"]
    assert load_config(path, {"MM_WORKSPACES": str(tmp_path / "w")}).workspaces_root == tmp_path / "w"


def test_missing_default_file_means_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(environ={})
    assert config.path is None
    assert config.agent.yolo is True and config.agent.maxTurns == 40
    assert config.database_url == "sqlite:///./var/mm.sqlite3"
    assert config.slack_api_url == "https://slack.com/api/"
    assert config.workspaces_root == tmp_path / "var" / "workspaces"
    assert config.missing_slack_secrets(socket_mode=False) == ["SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET"]
    assert not (tmp_path / "var").exists()  # loading creates nothing


def test_file_named_explicitly_must_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(environ={"MM_CONFIG": str(missing)})
    assert str(caught.value) == f"{missing}: no such file (MM_CONFIG names it; `mm-bot init` writes an example)"


def test_mm_config_picks_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "maxTurns: 7\n")
    config = load_config(environ={"MM_CONFIG": str(path)})
    assert config.path == path and config.agent.maxTurns == 7


def test_example_config_validates(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, example_config()), {})
    assert config.agent.yolo is True  # the documented default: `mm-bot run -p` works on the example as written
    assert config.service.approvals.timeout == 1800.0
    assert config.service.channel("C0NOTLISTED").repo == "https://git.example.com/acme/app.git"
    assert "SLACK_BOT_TOKEN" in example_config()


def test_empty_file_is_defaults(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "# nothing yet\n"), {})
    assert config.agent.yolo is True and config.service.jobs == []


def test_hostile_yaml_and_undecodable_file(tmp_path: Path) -> None:
    # safe_load only: a Python object tag is refused, not constructed.
    problems = _problems(tmp_path, "yolo: !!python/object/apply:os.system ['echo hi']\n")
    assert problems == [
        "1: invalid YAML: could not determine a constructor for the tag "
        "'tag:yaml.org,2002:python/object/apply:os.system'"
    ]
    path = tmp_path / "mm.yaml"
    path.write_bytes(b"yolo: \xff\xfe\n")
    expected = rf"^{re.escape(str(path))}: cannot read the file: 'utf-8' codec can't decode"
    with pytest.raises(ConfigError, match=expected):
        load_config(path, {})


# --- MM_CONFIG_OVERLAY ----------------------------------------------------------------------------------------


def test_an_overlay_is_laid_over_the_file_key_by_key(tmp_path: Path) -> None:
    file = tmp_path / "mm.yaml"
    file.write_text("yolo: true\nchannels:\n  default: {repo: https://git.example.com/a.git, branch: main}\n")
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("channels:\n  C0PLAY: {approvers: [U0GRACE], yolo: false}\n  default: {branch: dev}\n")
    config = load_config(file, {"MM_CONFIG_OVERLAY": str(overlay)})
    assert config.agent.yolo is True  # untouched by the overlay
    assert config.service.channels["default"].repo == "https://git.example.com/a.git"
    assert config.service.channels["default"].branch == "dev"  # a mapping merges; a value is replaced
    assert config.service.channels["C0PLAY"].approvers == ["U0GRACE"]
    assert config.service.channels["C0PLAY"].yolo is False
    # With no file at all, the overlay is the config.
    alone = load_config(None, {"MM_CONFIG_OVERLAY": str(overlay), "MM_CONFIG": ""})
    assert alone.service.channels["C0PLAY"].approvers == ["U0GRACE"]


def test_a_bad_overlay_stops_start_up_with_its_name(tmp_path: Path) -> None:
    file = tmp_path / "mm.yaml"
    file.write_text("channels:\n  default: {branch: main}\n")
    overlay = tmp_path / "overlay.yaml"
    for text, problem in (
        ("- a list\n", "must be a mapping of keys"),
        ("channels: {C0PLAY: {approvers: [nobody]}}\n", "expected a list of user or group ids"),
        ("channels: [\n", "cannot read the overlay"),
    ):
        overlay.write_text(text)
        with pytest.raises(ConfigError) as raised:
            load_config(file, {"MM_CONFIG_OVERLAY": str(overlay)})
        assert problem in str(raised.value), text
    with pytest.raises(ConfigError, match="cannot read the overlay"):
        load_config(file, {"MM_CONFIG_OVERLAY": str(tmp_path / "missing.yaml")})


def test_a_schedule_that_never_fires_is_refused(tmp_path: Path) -> None:
    job = "jobs:\n  - name: never\n    schedule: '0 0 30 2 *'\n    channel: C0123ABCD\n    prompt: tidy\n"
    assert _problems(tmp_path, job) == ['3: jobs[0].schedule: "0 0 30 2 *" never fires (no date matches it)']


def test_the_tool_calls_of_one_answer_are_bounded_for_the_worker(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "maxTurns: 10\n"), {})
    assert config.service.worker.maxToolCallsPerAnswer == 16
    assert config.agent.maxToolCallsPerAnswer is None  # `mm-bot run` keeps the reference's behaviour
    assert config.agent.with_tool_call_cap(16).maxToolCallsPerAnswer == 16
    # The agent's own key may only lower the worker's bound, never raise it.
    lower = load_config(_write(tmp_path, "maxToolCallsPerAnswer: 4\nworker: {maxToolCallsPerAnswer: 32}\n"), {})
    assert lower.agent.with_tool_call_cap(lower.service.worker.maxToolCallsPerAnswer).maxToolCallsPerAnswer == 4
    assert lower.agent.with_tool_call_cap(2).maxToolCallsPerAnswer == 2
    assert lower.agent.with_tool_call_cap(None).maxToolCallsPerAnswer == 4
    problems = _problems(
        tmp_path,
        """
        maxToolCallsPerAnswer: -1
        worker:
          maxToolCallsPerAnswer: 0
        """,
    )
    assert problems == [
        "1: maxToolCallsPerAnswer: expected a number >= 1, got -1",
        "3: worker.maxToolCallsPerAnswer: expected a number >= 1, got 0",
    ]
    assert _problems(tmp_path, "worker: {maxToolCallsPerAnswer: many}\n") == [
        "1: worker.maxToolCallsPerAnswer: expected an integer, got a string"
    ]
    assert _problems(tmp_path, "worker: {maxToolCallsPerAnswer: 2.5}\n") == [
        "1: worker.maxToolCallsPerAnswer: expected an integer, got a number"
    ]


def test_governance_keys_are_read(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
        model: {name: m, price: {input: 0.15, output: 0.6}}
        admins: [U0ADMIN, S0SECURITY]
        budgets: {turnTokens: 20k, threadTokens: 1.5M, turnTime: 10m, channelDayCost: 5}
        retention: {days: 30}
        approvals: {timeout: never, remindAfter: 10m, escalateAfter: 1h, escalateTo: [S0LEADS]}
        channels:
          C0123ABCD: {timezone: Europe/Paris, budgets: {channelDayTokens: 2000000}}
        """,
    )
    service = load_config(path, {}).service
    assert service.admins == ["U0ADMIN", "S0SECURITY"]
    assert (service.budgets.turnTokens, service.budgets.threadTokens) == (20_000, 1_500_000)
    assert (service.budgets.turnTime, service.budgets.channelDayCost) == (600.0, 5.0)
    assert service.retention.days == 30
    assert service.approvals.timeout is None  # never: a call waits until someone decides
    assert (service.approvals.remindAfter, service.approvals.escalateAfter) == (600.0, 3600.0)
    channel = service.channel("C0123ABCD")
    assert channel.timezone == "Europe/Paris" and channel.budgets and channel.budgets.channelDayTokens == 2_000_000


def test_bad_governance_keys_are_each_named(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
        admins: [alice]
        budgets: {turnTokens: lots, threadCost: 3}
        approvals: {timeout: 5m, remindAfter: 10m, escalateAfter: 1m}
        channels:
          C0123ABCD: {timezone: Mars/Olympus}
        """,
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    problems = str(caught.value).splitlines()
    assert any('admins: expected a list of user or group ids (U…, W… or S…), got "alice"' in p for p in problems)
    assert any(
        'budgets.turnTokens: expected a number of tokens such as 20000, 20k or 1.5M, got "lots"' in p for p in problems
    )
    assert any("approvals.remindAfter: it must be shorter than approvals.timeout (5m)" in p for p in problems)
    assert any("approvals.escalateTo: escalateAfter needs someone to escalate to" in p for p in problems)
    assert any('channels.C0123ABCD.timezone: unknown time zone "Mars/Olympus"' in p for p in problems)
    assert any(
        "model.price: budgets sets a money budget: every model needs its price, per million tokens" in p
        for p in problems
    )


def test_approval_policies_are_read_and_a_rule_nobody_could_satisfy_is_refused(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
        channels:
          default: {approvers: [U0BOB, S0LEADS]}
          C0123ABCD: {approvers: [U0BOB]}
        approvals:
          policies:
            - {name: push, tool: bash, commands: ["git push*"], ask: 2}
            - {tool: bash, commands: ["rm -rf /"], deny: true}
            - {paths: [".github/**"], ask: 3, approvers: [U0BOB, U0CAROL]}
            - {tool: bash, commands: [ls], allow: true, ask: true}
        """,
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    problems = str(caught.value)
    assert (
        "approvals.policies[0].ask: it asks 2 different people, but channel C0123ABCD's approvers are 1 person and "
        "no group: its calls could never be approved" in problems
    )
    assert "approvals.policies[2].ask: it asks 3 different people, but its approvers are 2 people" in problems
    assert "approvals.policies[3]: expected exactly one of allow, ask or deny, got allow and ask" in problems
    assert "policies[1]" not in problems


def test_the_governance_page_s_worked_example_loads(tmp_path: Path) -> None:
    """docs/governance.md's example is a team's whole config: it must stay one the service takes."""
    page = (Path(__file__).parent.parent / "docs" / "governance.md").read_text(encoding="utf-8")
    example = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    service = load_config(_write(tmp_path, example), {}).service
    names = [rule.name for rule in service.approvals.policies]
    assert names == ["root wipe", "two-person push", "CI files", "looking around"]
    assert service.approvals.timeout is None and service.approvals.escalateTo == ["S0ONCALL"]


def test_forges_are_read_with_each_kind_s_defaults(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "app.pem").write_text("-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n")
    path = _write(
        tmp_path,
        """
        forges:
          git.example.com: {kind: gitlab}
          code.example.com:8443: {kind: gitea, tokenEnv: CODE_TOKEN, username: bot}
          ghe.example.com: {kind: github, app: {id: 7, privateKeyFile: keys/app.pem}}
        pullRequest: {labels: [mm], reviewers: [alice]}
        """,
    )
    env = {"MM_GITLAB_TOKEN": "glpat-1", "CODE_TOKEN": "gt-2", "MM_GIT_TOKEN": "git-3", "MM_GITHUB_TOKEN": "ghp-4"}
    config = load_config(path, env)
    service = config.service
    lab, tea, hub = (service.forge(h) for h in ("git.example.com", "code.example.com:8443", "GHE.example.com:443"))
    assert lab is not None and tea is not None and hub is not None
    assert [f.api_url_for(h) for f, h in ((lab, "git.example.com"), (tea, "code.example.com:8443"))] == [
        "https://git.example.com",
        "https://code.example.com:8443",
    ]
    assert hub.api_url_for("ghe.example.com") == "https://ghe.example.com/api/v3"
    assert hub.app is not None and (hub.app.id, hub.app.installationId) == (7, None)
    assert (lab.username_for(None), tea.username_for("me"), hub.username_for("me")) == (
        "oauth2",
        "bot",
        "x-access-token",
    )
    # Known without a word: github.com's API is its own host; codeberg.org is a Gitea (Forgejo).
    github, codeberg = service.forge("github.com"), service.forge("codeberg.org")
    assert github is not None and github.api_url_for("github.com") == "https://api.github.com"
    assert codeberg is not None and (codeberg.kind, codeberg.username_for(None)) == ("gitea", "mm")
    assert service.forge("elsewhere.example.com") is None
    # Each kind's variable, else MM_GIT_TOKEN; a forge signing in as an App has its key, not a token.
    assert dict(config.forge_tokens) == {
        "github.com": "ghp-4",
        "gitlab.com": "glpat-1",
        "codeberg.org": "git-3",
        "git.example.com": "glpat-1",
        "code.example.com:8443": "gt-2",
    }
    assert list(config.forge_app_keys) == ["ghe.example.com"]
    assert config.forge_app_keys["ghe.example.com"].startswith("-----BEGIN RSA PRIVATE KEY-----")
    assert (service.pullRequest.draft, service.pullRequest.labels, service.pullRequest.followChecksMinutes) == (
        True,
        ["mm"],
        30,
    )
    assert {"glpat-1", "gt-2", "git-3", "ghp-4", config.forge_app_keys["ghe.example.com"]} <= set(secrets_of(config))


def test_bad_forges_are_each_named(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """
        forges:
          https://git.example.com: {kind: gitlab}
          git.example.com/acme: {kind: gitlab}
          Git.Example.com: {kind: gitlab}
          a.example.com: {kind: bitbucket}
          b.example.com: {kind: github, apiUrl: "http://b.example.com/api"}
          c.example.com: {kind: gitlab, app: {id: 1, privateKeyEnv: KEY}}
          d.example.com: {kind: github, app: {id: 1}}
          e.example.com: {kind: github, app: {id: 1, privateKeyFile: missing.pem}}
          f.example.com: {kind: github, app: {id: 1, privateKeyFile: mm.yaml}}
        pullRequest: {followChecksMinutes: -1, reviewer: [a]}
        """,
    )
    expected_host = (
        "expected a host as a URL writes it, in lower case, such as git.example.com or git.example.com:8443 "
        "(no scheme, no path)"
    )
    assert problems == [
        f"2: forges.https://git.example.com: {expected_host}",
        f"3: forges.git.example.com/acme: {expected_host}",
        f"4: forges.Git.Example.com: {expected_host}",
        '5: forges.a.example.com.kind: expected github, gitlab or gitea, got "bitbucket"',
        "6: forges.b.example.com.apiUrl: expected an https URL without credentials such as https://git.example.com, "
        "got 'http://b.example.com/api'",
        "7: forges.c.example.com: `app` is a GitHub App's: only a forge of kind github signs in as one",
        "8: forges.d.example.com.app: expected exactly one of privateKeyEnv and privateKeyFile "
        "(where the App's key is)",
        f"9: forges.e.example.com.app.privateKeyFile: cannot read {tmp_path / 'missing.pem'}: "
        "No such file or directory",
        f"10: forges.f.example.com.app.privateKeyFile: {tmp_path / 'mm.yaml'} holds no PEM private key (-----BEGIN …)",
        "11: pullRequest.followChecksMinutes: expected a number >= 0, got -1",
        '11: pullRequest.reviewer: unknown key (did you mean "reviewers"?)',
    ]


def test_a_job_with_a_pull_request_keeps_one_branch(tmp_path: Path) -> None:
    job = "jobs:\n  - name: nightly\n    schedule: '0 3 * * *'\n    channel: C0123ABCD\n    prompt: bump deps\n"
    [config] = load_config(_write(tmp_path, job + "    push: {pr: true}\n"), {}).service.jobs
    assert config.push is not None and (config.push.pr, config.push.branch) == (True, "mm/{job}")
    [config] = load_config(_write(tmp_path, job + "    push: {pr: true, branch: 'deps/{job}'}\n"), {}).service.jobs
    assert config.push is not None and config.push.branch == "deps/{job}"
    [config] = load_config(_write(tmp_path, job + "    push: true\n"), {}).service.jobs
    assert config.push is not None and (config.push.pr, config.push.branch) == (False, "mm/{job}/{date}-{run}")
    for branch in ("mm/{job}/{run}", "mm/{job}/{date}"):
        assert _problems(tmp_path, job + f"    push: {{pr: true, branch: '{branch}'}}\n") == [
            "6: jobs[0].push.branch: a job with pr: true keeps one branch for its pull request: drop {run}/{date}, "
            f"got '{branch}'"
        ]


def test_the_pull_requests_page_s_examples_load(tmp_path: Path) -> None:
    """docs/pull-requests.md's examples are whole configs (GitHub with a token, GitHub Enterprise with an App,
    GitLab with a job keeping a merge request, Gitea): each must stay one the service takes, as the page says."""
    page = (Path(__file__).parent.parent / "docs" / "pull-requests.md").read_text(encoding="utf-8")
    examples = [block.split("```", 1)[0] for block in page.split("```yaml\n")[1:]]
    assert len(examples) == 5
    loaded = [load_config(_write(tmp_path, example), {}).service for example in examples]
    job, token, app, gitlab, gitea = loaded
    assert job.jobs[0].push is not None and job.jobs[0].push.pr and job.jobs[0].push.branch == "mm/{job}"
    assert token.pullRequest.reviewers == ["acme-lead"] and token.forge("github.com") is not None
    ghe = app.forge("github.acme.internal")
    assert ghe is not None and ghe.app is not None and ghe.api_url_for("github.acme.internal").endswith("/api/v3")
    lab, tea, push = gitlab.forge("gitlab.acme.internal"), gitea.forge("git.acme.internal"), gitlab.jobs[0].push
    assert lab is not None and lab.tokenEnv == "MM_ACME_GITLAB_TOKEN" and push is not None and push.pr
    assert tea is not None and tea.kind == "gitea" and not gitea.pullRequest.draft
