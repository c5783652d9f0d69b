"""Many workspaces in one file: `teams.<id>` sections laid over the top-level keys (ServiceConfig.for_team), their
jobs in the one `jobs` list with their team, and a channel belonging to one workspace."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from chatops.config import FileConfig, ServiceConfig, example_config, load_config
from chatops.reload import ConfigFile
from config_support import problems, write


def service(tmp_path: Path, text: str) -> ServiceConfig:
    return load_config(write(tmp_path, text), {}).service


MANY = """
admins: [U0GLOBAL]
channels:
  default: {repo: https://git.example.com/global.git}
  C0SHARED: {repo: https://git.example.com/shared.git, approvers: [U0GLOBAL]}
  C0ORGWIDE: {repo: https://git.example.com/orgwide.git}
jobs:
  - {name: top, schedule: "0 1 * * *", channel: C0SHARED, prompt: p}
  - {name: top-of-b, schedule: "0 1 * * *", channel: C0B, prompt: p, team: T0BBB}
teams:
  E0ORG:
    admins: [S0ORGSEC]
    channels:
      C0ORGWIDE: {repo: https://git.example.com/org.git}
      C0SHARED: {repo: https://git.example.com/org-shared.git}
    jobs:
      - {name: org-weekly, schedule: "0 2 * * 1", channel: C0ORGWIDE, prompt: p}
  T0AAA:
    admins: [U0AADMIN]
    channels:
      default: {repo: https://git.example.com/a.git}
      C0SHARED: {repo: https://git.example.com/a-shared.git}
      C0A: {repo: https://git.example.com/a1.git}
    jobs:
      - {name: nightly-a, schedule: "0 3 * * *", channel: C0A, prompt: p}
  T0BBB:
    channels:
      C0B: {branch: dev}
"""


def test_a_workspace_sees_its_section_over_its_organisation_s_over_the_top_level(tmp_path: Path) -> None:
    config = service(tmp_path, MANY)
    a = config.for_team("T0AAA", "E0ORG")
    # The team's entry wins over the organisation's, which wins over the top level's; a whole entry replaces.
    assert a.channel("C0SHARED").repo == "https://git.example.com/a-shared.git"
    assert a.channel("C0SHARED").approvers == []  # not merged key by key with the top level's entry
    assert a.channel("C0ORGWIDE").repo == "https://git.example.com/org.git"
    assert a.channel("C0A").repo == "https://git.example.com/a1.git"
    # The section's `default` is this workspace's default channel.
    assert a.channel("C0NOTLISTED").repo == "https://git.example.com/a.git"
    assert a.admins == ["U0AADMIN"]

    # A workspace of the organisation without its own section: the organisation's, then the top level's.
    other = config.for_team("T0OTHER", "E0ORG")
    assert other.channel("C0SHARED").repo == "https://git.example.com/org-shared.git"
    assert other.channel("C0NOTLISTED").repo == "https://git.example.com/global.git"
    # T0AAA's channel keeps its own settings wherever it is seen from (a channel shared by Slack Connect, a caller
    # that does not know the workspace): a channel is configured in one place.
    assert other.channel("C0A").repo == "https://git.example.com/a1.git"
    assert other.admins == ["S0ORGSEC"]

    # A section naming no admins: the top level's (no organisation given).
    b = config.for_team("T0BBB")
    assert b.admins == ["U0GLOBAL"]
    assert b.channel("C0B").branch == "dev" and b.channel("C0B").repo is None  # replaced whole, not merged
    assert b.channel("C0SHARED").repo == "https://git.example.com/shared.git"
    # …and with its organisation named: the organisation's.
    assert config.for_team("T0BBB", "E0ORG").admins == ["S0ORGSEC"]

    # Everything else is the top level's, and the file's own view is untouched.
    assert a.jobs == config.jobs and a.approvals == config.approvals and a.teams == config.teams
    assert config.channel("C0SHARED").repo == "https://git.example.com/shared.git"
    assert config.admins == ["U0GLOBAL"]


def test_without_a_section_a_workspace_sees_the_very_same_config(tmp_path: Path) -> None:
    single = service(tmp_path, "admins: [U0GLOBAL]\nchannels:\n  C0ONE: {repo: https://git.example.com/one.git}\n")
    assert single.teams == {}
    for team, enterprise in (("T0AAA", None), ("T0AAA", "E0ORG"), (None, None), (None, "E0ORG")):
        assert single.for_team(team, enterprise) is single
    config = service(tmp_path, MANY)
    assert config.for_team(None) is config
    assert config.for_team("T0UNKNOWN", "E0UNKNOWN") is config
    # A section for the organisation alone is a view, all the same.
    assert config.for_team(None, "E0ORG") is not config
    assert config.for_team(None, "E0ORG").channel("C0ORGWIDE").repo == "https://git.example.com/org.git"


def test_the_sections_jobs_are_in_jobs_with_their_team(tmp_path: Path) -> None:
    config = service(tmp_path, MANY)
    assert [(j.name, j.team) for j in config.jobs] == [
        ("top", None),
        ("top-of-b", "T0BBB"),  # a top-level job naming its team keeps it
        ("org-weekly", "E0ORG"),
        ("nightly-a", "T0AAA"),
    ]
    # The section's own list says the same team.
    [nightly] = config.teams["T0AAA"].jobs
    assert nightly.team == "T0AAA" and nightly == config.jobs[3]
    # Written as the section's own id, `team` is accepted.
    text = MANY.replace("prompt: p}\n  T0AAA:", "prompt: p, team: E0ORG}\n  T0AAA:")
    assert text != MANY
    assert [j.team for j in service(tmp_path, text).jobs] == [None, "T0BBB", "E0ORG", "T0AAA"]


def test_a_dumped_config_validated_again_and_a_reload_hold_each_job_once(tmp_path: Path) -> None:
    config = service(tmp_path, MANY)
    for dumped in (config.model_dump(), config.model_dump(mode="json")):
        again = ServiceConfig.model_validate(dumped)
        assert again == config
        assert [j.name for j in again.jobs] == ["top", "top-of-b", "org-weekly", "nightly-a"]
        twice = ServiceConfig.model_validate(again.model_dump())
        assert [j.name for j in twice.jobs] == ["top", "top-of-b", "org-weekly", "nightly-a"]
    # The file's whole model too (load_config validates it, then the service's keys of its dump).
    whole = load_config(write(tmp_path, MANY), {})
    assert FileConfig.model_validate(FileConfig.model_validate(whole.service.model_dump()).model_dump()).jobs == (
        config.jobs
    )

    # chatops/reload.py: an edit adds a job to a section, and every job is there once.
    path = write(tmp_path, MANY)
    os.utime(path, (1_700_000_000, 1_700_000_000))
    config_file = ConfigFile(load_config(path, {}), check_s=0)
    added = "      - {name: nightly-a2, schedule: '0 4 * * *', channel: C0A, prompt: p}\n"
    path.write_text(textwrap.dedent(MANY).lstrip("\n").replace("  T0BBB:\n", added + "  T0BBB:\n"))
    os.utime(path, (1_700_000_100, 1_700_000_100))
    reloaded = config_file.current().service
    assert [(j.name, j.team) for j in reloaded.jobs] == [
        ("top", None),
        ("top-of-b", "T0BBB"),
        ("org-weekly", "E0ORG"),
        ("nightly-a", "T0AAA"),
        ("nightly-a2", "T0AAA"),
    ]
    assert [j.name for j in reloaded.teams["T0AAA"].jobs] == ["nightly-a", "nightly-a2"]


def test_a_section_s_key_must_be_a_team_or_an_enterprise_id(tmp_path: Path) -> None:
    assert problems(
        tmp_path,
        """
        teams:
          T0AAA: {}
          acme: {}
          t0lower: {}
          C0123ABCD: {}
          E0ORG: {admins: [alice]}
          T0BBB: {chanels: {}}
        jobs:
          - {name: j, schedule: "0 1 * * *", channel: C0A, prompt: p, team: workspace-a}
        """,
    ) == [
        "3: teams.acme: expected a team id (T…) or an enterprise id (E…) such as T0123ABCD as the key",
        "4: teams.t0lower: expected a team id (T…) or an enterprise id (E…) such as T0123ABCD as the key",
        "5: teams.C0123ABCD: expected a team id (T…) or an enterprise id (E…) such as T0123ABCD as the key",
        '6: teams.E0ORG.admins: expected a list of user or group ids (U…, W… or S…), got "alice"',
        '7: teams.T0BBB.chanels: unknown key (did you mean "channels"?)',
        "9: jobs[0].team: expected a team id (T…) or an enterprise id (E…) such as T0123ABCD, got 'workspace-a'",
    ]


def test_job_names_are_unique_across_the_whole_file(tmp_path: Path) -> None:
    assert problems(
        tmp_path,
        """
        jobs:
          - {name: nightly, schedule: "0 1 * * *", channel: C0TOP, prompt: p}
        teams:
          T0AAA:
            jobs:
              - {name: nightly-a, schedule: "0 3 * * *", channel: C0A, prompt: p}
              - name: nightly
                schedule: "0 3 * * *"
                channel: C0A
                prompt: p
          T0BBB:
            jobs:
              - {name: nightly-b, schedule: "0 3 * * *", channel: C0B, prompt: p}
              - {name: nightly-a, schedule: "0 3 * * *", channel: C0B, prompt: p}
              - {name: nightly-b, schedule: "0 4 * * *", channel: C0B}
        """,
    ) == [
        "7: teams.T0AAA.jobs[1].name: another job is already named 'nightly' (jobs[0])",
        "14: teams.T0BBB.jobs[1].name: another job is already named 'nightly-a' (teams.T0AAA.jobs[0])",
        "15: teams.T0BBB.jobs[2].name: another job is already named 'nightly-b'",
        "15: teams.T0BBB.jobs[2]: a job needs a prompt, or a skill to follow (or both)",
    ]


def test_a_channel_belongs_to_one_workspace(tmp_path: Path) -> None:
    assert problems(
        tmp_path,
        """
        channels:
          C0SHARED: {}
        teams:
          E0ORG:
            channels:
              C0SHARED: {}
              C0ORG: {}
          E0OTHER:
            channels: {C0ORG: {}}
          T0AAA:
            channels:
              default: {}
              C0SHARED: {}
              C0ORG: {}
              C0A: {}
          T0BBB:
            channels:
              default: {}
              C0A: {}
        """,
    ) == [
        "9: teams.E0OTHER.channels.C0ORG: teams.E0ORG configures this channel already: a channel is one workspace's",
        "19: teams.T0BBB.channels.C0A: teams.T0AAA configures this channel already: a channel is one workspace's",
    ]


def test_a_job_posts_in_its_own_workspace(tmp_path: Path) -> None:
    assert problems(
        tmp_path,
        """
        jobs:
          - {name: top, schedule: "0 1 * * *", channel: C0B, prompt: p, team: T0AAA}
          - {name: anywhere, schedule: "0 1 * * *", channel: C0B, prompt: p}
        teams:
          E0ORG:
            channels: {C0ORG: {}}
            jobs:
              - {name: org, schedule: "0 1 * * *", channel: C0A, prompt: p}
          T0AAA:
            channels: {C0A: {}}
            jobs:
              - {name: a-in-b, schedule: "0 1 * * *", channel: C0B, prompt: p}
              - {name: a-in-org, schedule: "0 1 * * *", channel: C0ORG, prompt: p}
              - {name: a-as-b, schedule: "0 1 * * *", channel: C0A, prompt: p, team: T0BBB}
          T0BBB:
            channels: {C0B: {}}
        """,
    ) == [
        "2: jobs[0].channel: teams.T0BBB configures C0B: a job of T0AAA cannot post there",
        "12: teams.T0AAA.jobs[0].channel: teams.T0BBB configures C0B: a job of T0AAA cannot post there",
        "14: teams.T0AAA.jobs[2].team: a job of teams.T0AAA runs in that team: leave `team` out, or write T0AAA",
    ]


def test_the_checks_of_every_channel_and_job_cover_the_sections(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("Answer in French.\n")
    config = load_config(
        write(
            tmp_path,
            """
            channels:
              C0TOP: {instructions: {file: a.md}}
            teams:
              T0AAA:
                channels:
                  C0A: {instructions: {file: a.md}, network: open}
                jobs:
                  - {name: a, schedule: "0 1 * * *", channel: C0A, prompt: p, network: "off"}
            """,
        ),
        {},
    )
    section = config.service.teams["T0AAA"]
    assert section.channels["C0A"].instructions == "Answer in French.\n"  # read, as the top level's is
    assert config.service.for_team("T0AAA").channel("C0A").instructions == "Answer in French.\n"
    assert config.service.channel("C0TOP").instructions == "Answer in French.\n"
    assert [n.policy for n in config.service.network_policies(config.agent)] == ["allow", "open", "off"]
    assert len(config.service.all_channels()) == 2

    assert problems(
        tmp_path,
        """
        approvals:
          policies:
            - {name: push, tool: bash, commands: ["git push*"], ask: 2}
        teams:
          T0AAA:
            channels:
              C0A: {model: big, approvers: [U0BOB]}
              C0B: {instructions: {file: missing.md}}
            jobs:
              - {name: a, schedule: "0 1 * * *", channel: C0A, agent: reviewer, prompt: p, budgets: {threadCost: 1}}
        """,
    ) == [
        # No `model:` in the file: its line is the file's first.
        "1: model.price: teams.T0AAA.jobs[0].budgets sets a money budget: every model needs its price, per "
        "million tokens",
        "3: approvals.policies[0].ask: it asks 2 different people, but channel C0A's approvers in teams.T0AAA are "
        "1 person and no group: its calls could never be approved",
        "7: teams.T0AAA.channels.C0A.model: no models entry is named 'big' (none is configured)",
        f"8: teams.T0AAA.channels.C0B.instructions.file: cannot read {tmp_path / 'missing.md'}: "
        "No such file or directory",
        "10: teams.T0AAA.jobs[0].agent: no mmConfigs entry is named 'reviewer' (none is configured)",
    ]


def test_the_models_refuse_on_their_own_what_they_cannot_flatten() -> None:
    job = {"name": "nightly", "schedule": "0 3 * * *", "channel": "C0A", "prompt": "p"}
    with pytest.raises(ValidationError, match="job 'nightly' names another team, T0BBB"):
        ServiceConfig.model_validate({"teams": {"T0AAA": {"jobs": [{**job, "team": "T0BBB"}]}}})
    with pytest.raises(ValidationError, match="another job is already named 'nightly'"):
        ServiceConfig.model_validate({"jobs": [job], "teams": {"T0AAA": {"jobs": [job]}}})
    with pytest.raises(ValidationError, match="another job is already named 'nightly'"):
        ServiceConfig.model_validate({"teams": {"T0AAA": {"jobs": [job]}, "T0BBB": {"jobs": [job]}}})


def test_the_documented_examples_load(tmp_path: Path) -> None:
    page = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text(encoding="utf-8")
    section = page.split("### Many workspaces: `teams`", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    config = service(tmp_path, example)
    sales = config.for_team("T0SALES", "E0ACME")
    assert sales.channel("C0ACMEALL").approvers == ["S0ACMELEADS"]
    assert sales.channel("C0NEW").repo == "https://git.example.com/acme/crm.git"
    assert sales.admins == ["S0ACMESEC"]
    assert [(j.name, j.team) for j in config.jobs] == [("nightly-crm", "T0SALES")]
    # `mm-bot init`'s example, its `teams` block uncommented, loads too.
    lines = example_config().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("# teams:"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("#   ") and i > start)
    block = "".join(line.removeprefix("# ") for line in lines[start:end])
    uncommented = service(tmp_path, block)
    assert [(j.name, j.team) for j in uncommented.jobs] == [("sales-nightly", "T0123ABCD")]
    assert uncommented.for_team("T0123ABCD").admins == ["U01SALES"]
