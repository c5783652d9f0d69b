"""Keeping workspaces apart (chatops.teams): the one rule that says whether a request comes from a thread's
workspace, the read models filtered by workspace (App Home's sessions and calls, the audit), what an uninstall
does to a workspace's turns and jobs (chatops.uninstall), a channel of a `teams` section seen from any view, and
the install link's scopes and page (bot.oauth). On SQLite and PostgreSQL (the test kit's `engine`)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine, select, update

from audit_support import add_call
from bot.oauth import MANIFEST, authorize_url, bot_scopes
from chatops.audit import AuditFilter, calls
from chatops.config import ServiceConfig
from chatops.inbox import record_message
from chatops.jobs import overview, set_paused
from chatops.queries import pending_approvals, recent_sessions
from chatops.schema import Session, SessionStatus, utcnow
from chatops.sessions import snapshot
from chatops.store import request_approval
from chatops.teams import NOWHERE, Team, in_workspace, same_workspace, section_covers, session_team, team_of
from chatops.uninstall import PAUSED_WHY, uninstalled

ROOT = Path(__file__).resolve().parent.parent


def unique(prefix: str) -> str:
    """An id of the test's own (`T…`, `E…`, `C…`, `U…`): the module's database is shared by its tests."""
    return prefix + uuid.uuid4().hex[:10].upper()


# -- same_workspace -------------------------------------------------------------------------------------------------

A, B, ORG, OTHER_ORG = "T0AAA", "T0BBB", "E0ORG", "E0OTHER"


@pytest.mark.parametrize(
    ("thread", "request_from", "same"),
    [
        (Team(A), Team(A), True),
        (Team(A), Team(B), False),
        (Team(A, ORG), Team(A, ORG), True),
        (Team(A, ORG), Team(B, ORG), False),  # two workspaces of one org are two workspaces
        (Team(A, ORG), Team(A, OTHER_ORG), False),
        (Team(None, ORG), Team(A, OTHER_ORG), False),  # an org's thread, a click from another org
        (Team(None, ORG), Team(None, OTHER_ORG), False),
        # What one side does not know does not refuse: a thread recorded before workspaces, Slack leaving the
        # org out, a request that names no workspace (single-token mode).
        (Team(A, ORG), Team(A), True),
        (Team(A), Team(A, ORG), True),
        (Team(None, ORG), Team(A, ORG), True),
        (Team(A, ORG), Team(None, ORG), True),
        (NOWHERE, Team(B, OTHER_ORG), True),
        (Team(A, ORG), NOWHERE, True),
        (NOWHERE, NOWHERE, True),
    ],
)
def test_same_workspace_refuses_only_what_both_sides_know_to_differ(
    thread: Team, request_from: Team, same: bool
) -> None:
    assert same_workspace(thread, request_from) is same


def test_a_team_is_named_by_its_section_key_and_said_with_its_org() -> None:
    assert Team.named("T0AAA") == Team("T0AAA") and Team.named("E0ORG") == Team(None, "E0ORG")
    assert Team.named(None) == NOWHERE
    assert (str(Team(A, ORG)), str(Team(A)), str(Team(None, ORG)), str(NOWHERE)) == (
        f"{A} (org {ORG})",
        A,
        f"org {ORG}",
        "an unknown workspace",
    )


# -- the read models ------------------------------------------------------------------------------------------------


def thread(
    engine: Engine,
    team: Team,
    *,
    user: str,
    channel: str | None = None,
    status: SessionStatus | None = None,
) -> str:
    """A thread of `team` started by `user` (its first message recorded as the bot records it), its session's id."""
    ts = f"{1_767_600_000 + uuid.uuid4().int % 10_000_000}.000100"
    recorded = record_message(
        engine,
        channel_id=channel or unique("C"),
        thread_ts=ts,
        message_ts=ts,
        user_id=user,
        text="please deploy",
        slack_team_id=team.team_id,
        enterprise_id=team.enterprise_id,
    )
    if status is not None:
        with engine.begin() as conn:
            conn.execute(update(Session).where(Session.id == recorded.session_id).values(status=status))
    return recorded.session_id


class Workspaces:
    """One person's threads in two workspaces, two workspaces of an org, a workspace of another org, and before
    workspaces; a pending approval and a tool call in each."""

    def __init__(self, engine: Engine) -> None:
        self.user = unique("U")
        self.a, self.b = unique("T"), unique("T")
        self.org, self.g1, self.g2 = unique("E"), unique("T"), unique("T")
        self.channel = unique("C")  # every thread in one channel: the audit of it is this test's
        self.sessions = {
            "a": thread(engine, Team(self.a), user=self.user, channel=self.channel),
            "b": thread(engine, Team(self.b), user=self.user, channel=self.channel),
            "g1": thread(engine, Team(self.g1, self.org), user=self.user, channel=self.channel),
            "g2": thread(engine, Team(self.g2, self.org), user=self.user, channel=self.channel),
            "before": thread(engine, NOWHERE, user=self.user, channel=self.channel),
            "other_org": thread(engine, Team(unique("T"), unique("E")), user=self.user, channel=self.channel),
        }
        for name, session_id in self.sessions.items():
            request_approval(engine, call_id=f"call_{session_id[:8]}_{name}", session_id=session_id, tool="bash")
            add_call(engine, session_id)

    def named(self, ids: list[str]) -> set[str]:
        by_id = {session_id: name for name, session_id in self.sessions.items()}
        return {by_id[i] for i in ids if i in by_id}


@pytest.mark.parametrize(
    ("view", "seen"),
    [
        (lambda w: Team(w.a), {"a", "before"}),
        (lambda w: Team(w.b), {"b", "before"}),
        (lambda w: Team(w.g1, w.org), {"g1", "before"}),
        (lambda w: Team(w.g2, w.org), {"g2", "before"}),
        (lambda w: NOWHERE, {"a", "b", "g1", "g2", "before", "other_org"}),  # single-token mode: the one workspace
    ],
    ids=["workspace-a", "workspace-b", "org-workspace-1", "org-workspace-2", "nowhere"],
)
def test_the_read_models_show_a_workspace_its_own_threads_and_those_recorded_before_workspaces(
    engine: Engine, view: Any, seen: set[str]
) -> None:
    w = Workspaces(engine)
    place: Team = view(w)
    assert w.named([s.id for s in recent_sessions(engine, w.user, limit=50, place=place)]) == seen
    assert w.named([p.row.session_id for p in pending_approvals(engine, limit=10_000, place=place)]) == seen
    audited = calls(engine, AuditFilter(channel=w.channel, place=place))
    assert w.named([c.session_id for c in audited]) == seen
    # The conditions themselves, on a query of their own.
    with engine.connect() as conn:
        found = conn.execute(select(Session.id).where(Session.channel_id == w.channel, *in_workspace(place))).scalars()
        assert w.named(list(found)) == seen


def test_an_org_s_view_holds_its_workspaces_threads_and_not_another_org_s(engine: Engine) -> None:
    w = Workspaces(engine)
    place = Team(None, w.org)  # a request Slack names the org of, and no workspace
    views = {
        "recent": w.named([s.id for s in recent_sessions(engine, w.user, limit=50, place=place)]),
        "pending": w.named([p.row.session_id for p in pending_approvals(engine, limit=10_000, place=place)]),
        "audit": w.named([c.session_id for c in calls(engine, AuditFilter(channel=w.channel, place=place))]),
    }
    for name, seen in views.items():
        assert {"g1", "g2", "before"} <= seen and "other_org" not in seen, name


def test_a_session_knows_its_workspace_and_org(engine: Engine) -> None:
    team = Team(unique("T"), unique("E"))
    session_id = thread(engine, team, user=unique("U"))
    found = snapshot(engine, session_id, log=False)
    assert found is not None and team_of(found) == team
    other = Team(unique("T"))
    elsewhere = thread(engine, other, user=unique("U"))
    assert session_team(engine, session_id) == team and session_team(engine, elsewhere) == other
    assert session_team(engine, "no-such-session") == NOWHERE


@pytest.mark.parametrize(
    ("key", "place", "covers"),
    [
        (None, Team(A, ORG), True),  # the top level's jobs: every workspace's
        (A, Team(A, ORG), True),
        (ORG, Team(A, ORG), True),  # an org's section: each of its workspaces'
        (ORG, Team(None, ORG), True),
        (B, Team(A, ORG), False),
        (OTHER_ORG, Team(A, ORG), False),
        (B, Team(A), False),
        (A, NOWHERE, True),  # a request that names no workspace (single-token mode): every section
    ],
)
def test_a_section_belongs_to_its_workspace_and_to_every_workspace_of_its_org(
    key: str | None, place: Team, covers: bool
) -> None:
    assert section_covers(key, place) is covers


# -- uninstalling ---------------------------------------------------------------------------------------------------

BUSY = (SessionStatus.RUNNING, SessionStatus.AWAITING_APPROVAL, SessionStatus.QUEUED)


def stop_asked(engine: Engine, session_ids: list[str]) -> dict[str, bool]:
    with engine.connect() as conn:
        found = conn.execute(select(Session.id, Session.stop_requested_at).where(Session.id.in_(session_ids))).all()
    return {session_id: at is not None for session_id, at in found}


def jobs_config(a: str, b: str, org: str, in_org: str) -> tuple[ServiceConfig, dict[str, str]]:
    """A job in each of workspaces a and b, one of the org, one of a workspace of the org, one at the top."""
    names = {key: f"job-{key}-{uuid.uuid4().hex[:8]}" for key in ("a", "b", "org", "in_org", "top")}

    def job(key: str) -> dict[str, Any]:
        return {"name": names[key], "schedule": "0 3 * * *", "channel": "C0JOBS", "prompt": "p"}

    service = ServiceConfig.model_validate(
        {
            "jobs": [job("top")],
            "teams": {
                a: {"jobs": [job("a")]},
                b: {"jobs": [job("b")]},
                org: {"jobs": [job("org")]},
                in_org: {"jobs": [job("in_org")]},
            },
        }
    )
    return service, names


def paused(engine: Engine, names: dict[str, str]) -> dict[str, str | None]:
    """The paused jobs, by key, with their reason."""
    states = overview(engine, names.values())
    return {key: states[name].paused_reason for key, name in names.items() if states[name].paused}


def test_an_uninstall_stops_the_workspace_s_busy_turns_and_pauses_its_jobs_alone(engine: Engine) -> None:
    a, b, org, g1 = unique("T"), unique("T"), unique("E"), unique("T")
    service, jobs = jobs_config(a, b, org, g1)
    user = unique("U")
    busy_a = [thread(engine, Team(a), user=user, status=s) for s in BUSY]
    idle_a = thread(engine, Team(a), user=user, status=SessionStatus.IDLE)
    busy_b = [thread(engine, Team(b), user=user, status=s) for s in BUSY]
    before = thread(engine, NOWHERE, user=user, status=SessionStatus.RUNNING)

    done = uninstalled(engine, service, Team(a))
    assert done.stopped == 3 and done.paused == (jobs["a"],)
    asked = stop_asked(engine, [*busy_a, idle_a, *busy_b, before])
    assert [asked[s] for s in busy_a] == [True, True, True]
    assert not asked[idle_a] and not any(asked[s] for s in busy_b) and not asked[before]
    why = PAUSED_WHY.format(team=Team(a))
    assert why == f"paused: the app was removed from Slack workspace {a}"
    assert paused(engine, jobs) == {"a": why}

    # Slack sends tokens_revoked, then app_uninstalled: the second changes nothing more.
    again = uninstalled(engine, service, Team(a))
    assert again.paused == ()
    assert stop_asked(engine, [*busy_a, idle_a, *busy_b, before]) == asked
    assert paused(engine, jobs) == {"a": why}


def test_an_org_wide_uninstall_stops_every_workspace_of_the_org_and_pauses_the_org_s_jobs(engine: Engine) -> None:
    a, b, org, g1 = unique("T"), unique("T"), unique("E"), unique("T")
    service, jobs = jobs_config(a, b, org, g1)
    user = unique("U")
    in_org = [thread(engine, Team(t, org), user=user, status=SessionStatus.RUNNING) for t in (g1, unique("T"))]
    elsewhere = [
        thread(engine, Team(a), user=user, status=SessionStatus.RUNNING),
        thread(engine, Team(unique("T"), unique("E")), user=user, status=SessionStatus.QUEUED),
    ]
    done = uninstalled(engine, service, Team(None, org))
    assert done.stopped == 2 and done.paused == (jobs["org"],)
    asked = stop_asked(engine, [*in_org, *elsewhere])
    assert all(asked[s] for s in in_org) and not any(asked[s] for s in elsewhere)
    assert paused(engine, jobs) == {"org": PAUSED_WHY.format(team=Team(None, org))}
    assert "org " + org in PAUSED_WHY.format(team=Team(None, org))


def test_an_uninstall_keeps_a_job_a_person_paused_as_they_paused_it(engine: Engine) -> None:
    a, b, org, g1 = unique("T"), unique("T"), unique("E"), unique("T")
    service, jobs = jobs_config(a, b, org, g1)
    assert set_paused(engine, jobs["a"], True, "U0BOB", utcnow() - timedelta(hours=1))
    assert uninstalled(engine, service, Team(a)).paused == ()
    assert paused(engine, jobs) == {"a": "paused by <@U0BOB>"}


def test_an_uninstall_naming_no_workspace_does_nothing(engine: Engine) -> None:
    service, jobs = jobs_config(unique("T"), unique("T"), unique("E"), unique("T"))
    running = thread(engine, NOWHERE, user=unique("U"), status=SessionStatus.RUNNING)
    assert uninstalled(engine, service, NOWHERE).stopped == 0
    assert stop_asked(engine, [running]) == {running: False} and paused(engine, jobs) == {}


# -- the config: a section's channel from any view ------------------------------------------------------------------


def test_a_section_s_channel_is_found_from_the_global_view() -> None:
    service = ServiceConfig.model_validate(
        {
            "channels": {
                "default": {"repo": "https://git.example.com/global.git"},
                "C0TOP": {"repo": "https://git.example.com/top.git"},
            },
            "teams": {
                ORG: {"channels": {"C0ORGWIDE": {"repo": "https://git.example.com/org.git"}}},
                A: {
                    "channels": {
                        "default": {"repo": "https://git.example.com/a-default.git"},
                        "C0A": {"repo": "https://git.example.com/a.git", "approvers": ["U0ALICE"]},
                    },
                    "jobs": [{"name": "nightly-a", "schedule": "0 1 * * *", "channel": "C0NEW", "prompt": "p"}],
                },
            },
        }
    )
    # A caller that does not know the workspace (a worker's check, the scheduler): the channel's own section.
    assert service.channel("C0A").repo == "https://git.example.com/a.git"
    assert service.channel("C0A").approvers == ["U0ALICE"]
    assert service.channel("C0ORGWIDE").repo == "https://git.example.com/org.git"
    assert service.channel("C0TOP").repo == "https://git.example.com/top.git"
    # A channel no section names: the top level's default, never a section's own default.
    assert service.channel("C0ELSEWHERE").repo == "https://git.example.com/global.git"
    assert service.channel("default").repo == "https://git.example.com/global.git"
    # Seen from another workspace, A's channel is still A's.
    assert service.for_team(B).channel("C0A").repo == "https://git.example.com/a.git"
    # A workspace's own entry over its org's, for a channel both name (the workspace is in the org).
    both = ServiceConfig.model_validate(
        {
            "teams": {
                ORG: {"channels": {"C0BOTH": {"repo": "https://git.example.com/org.git"}}},
                A: {
                    "channels": {
                        "default": {"repo": "https://git.example.com/a-default.git"},
                        "C0BOTH": {"repo": "https://git.example.com/a.git"},
                    }
                },
            }
        }
    )
    assert both.channel("C0BOTH").repo == "https://git.example.com/a.git"
    # Without a top-level default, no section's default stands for everyone's.
    assert both.channel("default").repo is None and both.channel("C0ELSEWHERE").repo is None
    # A job of A's section sees A's view: its channel, unlisted, is A's default one.
    [job] = service.jobs
    assert job.team == A
    assert service.for_job(job).channel("C0NEW").repo == "https://git.example.com/a-default.git"


# -- the install link -----------------------------------------------------------------------------------------------


def test_the_bot_scopes_are_the_manifest_s() -> None:
    manifest = yaml.safe_load((ROOT / "bot" / MANIFEST).read_text(encoding="utf-8"))
    assert list(bot_scopes()) == manifest["oauth_config"]["scopes"]["bot"]
    assert "chat:write" in bot_scopes() and len(set(bot_scopes())) == len(bot_scopes())


@pytest.mark.parametrize(
    ("api_url", "page"),
    [
        ("https://slack.com/api/", "https://slack.com/oauth/v2/authorize"),
        ("https://slack.com/api", "https://slack.com/oauth/v2/authorize"),
        ("https://slack-gov.com/api/", "https://slack-gov.com/oauth/v2/authorize"),
        ("http://127.0.0.1:41234/api/", "http://127.0.0.1:41234/oauth/v2/authorize"),
    ],
)
def test_the_authorize_page_is_beside_the_web_api(api_url: str, page: str) -> None:
    assert authorize_url(api_url) == page


def test_the_authorize_page_of_the_emulator_is_its_own(slack: Any) -> None:
    assert authorize_url(slack.url) == slack.authorize_url
