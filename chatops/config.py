"""The service's configuration: one YAML file (the agent's keys and the service's keys) plus the environment.

Secrets and endpoints come only from the environment; everything else from the file. A bad file stops
start-up with `file:line: dotted.key: what was expected`, one line per problem, and an unknown key is always
an error, because a typo silently ignored is a setting silently not applied.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import stat
import types
import typing
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from croniter import croniter
from pydantic import BeforeValidator, Field, ValidationError, ValidationInfo, field_validator, model_validator

from chatops.errors import ChatopsError
from mm_core.config import (
    AgentConfig,
    Duration,
    ModelConfig,
    NetworkConfig,
    NetworkSetting,
    Strict,
    YamlProblem,
    parse_duration,
    read_yaml,
    with_refs_from,
)
from mm_core.policy import Rule

DEFAULT_CONFIG_FILE = "mm.yaml"
DEFAULT_DATABASE_URL = "sqlite:///./var/mm.sqlite3"
DEFAULT_BROKER_URL = "redis://localhost:6379/0"
DEFAULT_SLACK_API_URL = "https://slack.com/api/"
DEFAULT_WORKSPACES = "./var/workspaces"
# Every environment variable load_config reads (besides the one `model.apiKeyEnv` names): what a test or a
# benchmark clears so that a child process starts from none of the caller's settings.
ENVIRONMENT = (
    "MM_CONFIG",
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "SLACK_API_URL",
    "SLACK_BOT_TOKEN",
    "SLACK_SIGNING_SECRET",
    "SLACK_APP_TOKEN",
    "SLACK_CLIENT_ID",
    "SLACK_CLIENT_SECRET",
    "SLACK_REDIRECT_URI",
    "MM_MODEL_URL",
    "MM_MODEL",
    "MM_WORKSPACES",
    "MM_CONFIG_OVERLAY",
    "MM_GIT_USERNAME",
    "MM_GIT_TOKEN",
    # The forges' tokens by kind (`forges.<host>.tokenEnv` names another): read for every known forge.
    "MM_GITHUB_TOKEN",
    "MM_GITLAB_TOKEN",
    "MM_GITEA_TOKEN",
)
# Where a person setting up the Slack app is sent by every message about a missing or refused secret.
SLACK_DOCS = "docs/slack-app.md"

# Slack ids: channels C/G (private, legacy) and D (direct messages); users U/W; user groups S; workspaces T and
# Enterprise Grid organisations E (a `teams` section's key, a job's `team`).
_CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{2,}$")
_APPROVER_ID = re.compile(r"^[UWS][A-Z0-9]{2,}$")
_TEAM_ID = re.compile(r"^[TE][A-Z0-9]{2,}$")
_EXPECTED_TEAM = "expected a team id (T…) or an enterprise id (E…) such as T0123ABCD"
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_BRANCH = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
# The most a channel's instructions file may hold: it goes whole into the system prompt of every turn.
MAX_INSTRUCTIONS_BYTES = 32_000
MAX_INSTRUCTION_FILES = 8
# A name of `models`: what a person types in `model=NAME`.
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


class ConfigError(ChatopsError):
    """The configuration cannot be used; str() is one `file:line: key: problem` line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


# --- the service's keys -------------------------------------------------------------------------------------


_TOKENS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_tokens(value: object) -> int:
    """A number of tokens: `20000`, `20k`, `1.5M`."""
    expected = "expected a number of tokens such as 20000, 20k or 1.5M"
    if isinstance(value, bool):
        raise ValueError(expected)
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and (m := _TOKENS.match(value)):
        number = int(float(m.group(1)) * {"": 1, "k": 1_000, "m": 1_000_000}[m.group(2).lower()])
    else:
        raise ValueError(f"{expected}, got {_describe(value, quote=True)}")
    if number < 1:
        raise ValueError(f"{expected} (at least 1), got {_describe(value, quote=True)}")
    return number


Tokens = typing.Annotated[int, BeforeValidator(parse_tokens)]


def _zone_name(value: str) -> str:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f'unknown time zone "{value}" (expected an IANA name such as Europe/Paris)') from None
    return value


def _slack_ids(value: Any) -> Any:
    """A list of Slack user (U…, W…) or user group (S…) ids."""
    if not isinstance(value, list):
        raise ValueError(f"expected a list of user or group ids, got {_describe(value)}")
    for item in value:
        if not isinstance(item, str) or not _APPROVER_ID.match(item):
            raise ValueError(f"expected a list of user or group ids (U…, W… or S…), got {_describe(item, quote=True)}")
    return value


SlackIds = typing.Annotated[list[str], BeforeValidator(_slack_ids)]


class BudgetsConfig(Strict):
    """What a turn, a thread (a job's run) and a channel's day may spend. Each unset key sets no limit; a channel's
    or a job's `budgets` key replaces the top-level one of the same name (chatops/budgets.py)."""

    turnTokens: Tokens | None = None
    threadTokens: Tokens | None = None
    turnTime: Duration | None = None
    channelDayTokens: Tokens | None = None
    # Money, in the currency of `price` (every model a channel may use needs one).
    threadCost: float | None = Field(default=None, gt=0)
    channelDayCost: float | None = Field(default=None, gt=0)


class InstructionsFile(Strict):
    file: str


class ChannelConfig(Strict):
    repo: str | None = None
    branch: str | None = None
    approvers: list[str] = Field(default_factory=list)
    yolo: bool | None = None
    # URL patterns of the repositories a thread may ask for in Slack (`@mm repo <url>`): chatops/repos.py.
    repos: list[str] = Field(default_factory=list)
    # What every turn's system prompt adds for this channel: a text, or {file: PATH} relative to the config file,
    # which load_config reads (so that it is always the text itself once loaded).
    instructions: str | InstructionsFile | None = None
    # The repository's own instruction files, relative to its root, read at each turn (mm_core.instructions).
    instructionFiles: list[str] = Field(default_factory=lambda: ["AGENTS.md"])
    # The `models` entry a thread of this channel runs with unless its mention says `model=NAME` (None: `model`).
    model: str | None = None
    # The channel's own limits over the top-level `budgets`, key by key.
    budgets: BudgetsConfig | None = None
    # Where the channel's day starts and ends, for `budgets.channelDayTokens` and `channelDayCost`.
    timezone: str = "UTC"
    # The channel's own egress policy, in place of the top-level `network` (docs/network.md).
    network: NetworkSetting | None = None

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        return _zone_name(value)

    @field_validator("instructions", mode="before")
    @classmethod
    def _instructions(cls, value: Any) -> Any:
        if value is None or isinstance(value, str) or (isinstance(value, dict) and set(value) == {"file"}):
            return value
        raise ValueError(f"expected a text, or {{file: PATH}} (relative to the config file), got {_describe(value)}")

    @field_validator("instructionFiles", mode="before")
    @classmethod
    def _instruction_files(cls, value: Any) -> Any:
        expected = "expected a list of paths relative to the repository's root, such as AGENTS.md"
        if not isinstance(value, list):
            raise ValueError(f"{expected}, got {_describe(value)}")
        if len(value) > MAX_INSTRUCTION_FILES:
            raise ValueError(f"{expected}, at most {MAX_INSTRUCTION_FILES} of them, got {len(value)}")
        for item in value:
            if not isinstance(item, str):
                raise ValueError(f"{expected}, got {_describe(item, quote=True)}")
            parts = item.split("/")
            if (
                not item
                or item.startswith("/")
                or any(p in ("", ".", "..") for p in parts)
                or any(not c.isprintable() for c in item)
            ):
                raise ValueError(f"{expected}, got {_describe(item, quote=True)}")
        return value

    @field_validator("approvers", mode="before")
    @classmethod
    def _approver_ids(cls, value: Any) -> Any:
        return _slack_ids(value)

    @field_validator("repos", mode="before")
    @classmethod
    def _repo_patterns(cls, value: Any) -> Any:
        expected = 'expected a list of https:// URL patterns such as "https://github.com/acme/*"'
        if not isinstance(value, list):
            raise ValueError(f"{expected}, got {_describe(value)}")
        for item in value:
            if not isinstance(item, str):
                raise ValueError(f"{expected}, got {_describe(item, quote=True)}")
            https = item[:8].lower() == "https://"
            authority, slash, path = item[8:].partition("/")
            if https and "@" in authority:
                # Shown without its user part, which may be a password or a token.
                shown = f"https://***@{authority.rsplit('@', 1)[1]}{slash}{path}"
                raise ValueError(f'{expected}, got "{shown}" (credentials do not go in a pattern)')
            if not https or not authority or any(c.isspace() or not c.isprintable() or c in "?#" for c in item):
                raise ValueError(f"{expected}, got {_describe(item, quote=True)}")
        return value


def _never(value: Any) -> Any:
    return None if value == "never" else value


class ApprovalsConfig(Strict):
    requester_can_approve: bool = False
    # A pending approval expires after this and the call is rejected; `never`: it waits until someone decides
    # (the turn holds no worker while it waits).
    timeout: typing.Annotated[Duration | None, BeforeValidator(_never)] = 1800.0
    # A reminder in the thread naming the approvers, once, when a call has waited this long.
    remindAfter: Duration | None = None
    # When a call has waited this long, the `escalateTo` users and groups may approve it too, and are asked.
    escalateAfter: Duration | None = None
    escalateTo: SlackIds = Field(default_factory=list)
    # Which calls run, ask (how many people, which) or are refused, by rule: mm_core/policy.py, docs/governance.md.
    policies: list[Rule] = Field(default_factory=list)


def is_branch_name(name: str) -> bool:
    """A branch name the worker's git may push to: letters, digits, `._/-`, none of git's forbidden shapes."""
    shapes = ".." in name or "//" in name or name.endswith((".lock", "/", "."))
    return bool(_BRANCH.match(name)) and not shapes


class JobPushConfig(Strict):
    # Open (then keep up to date) a pull request of the branch: the job keeps one branch, pushed again each run.
    # Declared first: the branch's check below reads it.
    pr: bool = False
    # Where the run's branch goes: a remote URL (credentials come from the environment, never from here), or
    # none for the job's own repository.
    remote: str | None = None
    # The branch's name; {job}, {date} (the run's scheduled day, YYYY-MM-DD) and {run} (its number) are filled in.
    # Without `pr` each run pushes a branch of its own; with it the default is `mm/{job}`.
    branch: str = "mm/{job}/{date}-{run}"

    @model_validator(mode="before")
    @classmethod
    def _one_branch_for_a_pull_request(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("pr") is True and "branch" not in value:
            return {**value, "branch": "mm/{job}"}
        return value

    @field_validator("remote")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        if value is not None and "://" in value and "@" in value.split("://", 1)[1].split("/", 1)[0]:
            raise ValueError("credentials do not go in the remote's URL: they come from the environment")
        return value

    @field_validator("branch")
    @classmethod
    def _branch(cls, value: str, info: ValidationInfo) -> str:
        probe = value.replace("{job}", "job").replace("{date}", "2026-01-01").replace("{run}", "1")
        if not is_branch_name(probe):
            raise ValueError(f"expected a git branch name (with {{job}}, {{date}}, {{run}} if wanted), got {value!r}")
        if info.data.get("pr") is True:
            # Its pull request follows the branch: a branch per run would open a pull request per run.
            if "{run}" in value or "{date}" in value:
                raise ValueError(
                    f"a job with pr: true keeps one branch for its pull request: drop {{run}}/{{date}}, got {value!r}"
                )
        elif "{run}" not in value:
            # Each run's branch is new: a second push to one branch would be refused (no fast-forward).
            raise ValueError(f"expected {{run}} in the branch (each run pushes a branch of its own), got {value!r}")
        return value


class JobConfig(Strict):
    name: str
    schedule: str
    timezone: str = "UTC"
    channel: str
    # What the agent is asked; with `skill`, what follows the instruction to read and follow that skill.
    prompt: str | None = None
    skill: str | None = None
    repo: str | None = None
    branch: str | None = None
    # An `mmConfigs` entry whose agent runs the job (None: the config's own agent).
    agent: str | None = None
    # true: nobody is asked (yolo); false: the channel's approvers decide in the run's thread; unset: the channel's.
    yolo: bool | None = None
    # A run taking longer is stopped, and counts as failed.
    timeLimit: Duration = 1800.0
    enabled: bool = True
    # After this many failed runs in a row the job pauses itself (and says so in its channel).
    maxFailures: int = Field(default=3, ge=1, le=1000)
    # Push the run's changes to a branch: true for the defaults, or where and how (None: no push).
    push: JobPushConfig | None = None
    # The run's own limits over the channel's and the top-level `budgets`, key by key (the run is its thread).
    budgets: BudgetsConfig | None = None
    # The run's own egress policy, in place of its channel's and the top-level `network`.
    network: NetworkSetting | None = None
    # The workspace (T…) or organisation (E…) whose installation runs the job and posts its thread (None: the
    # only one). A job written under `teams.<id>.jobs` gets that id.
    team: str | None = None

    @field_validator("push", mode="before")
    @classmethod
    def _push(cls, value: Any) -> Any:
        if value is True:
            return {}
        if value is False or value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError(f"expected true, false or a mapping of remote and branch, got {_describe(value)}")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _JOB_NAME.match(value) or not is_branch_name(value):  # it names its runs' branches
            raise ValueError(
                f"expected a name of letters, digits, '-', '_' or '.' that could name a git branch, got {value!r}"
            )
        return value

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str) -> str:
        if not croniter.is_valid(value) or len(value.split()) != 5:
            raise ValueError(f'expected a cron expression of 5 fields such as "0 3 * * 1-5", got "{value}"')
        try:
            croniter(value).get_next()
        except Exception:  # noqa: BLE001 - croniter's own error when no date matches (30 February)
            raise ValueError(f'"{value}" never fires (no date matches it)') from None
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        return _zone_name(value)

    @field_validator("channel")
    @classmethod
    def _channel(cls, value: str) -> str:
        if not _CHANNEL_ID.match(value):
            raise ValueError(f"expected a channel id such as C0123ABCD, got {value!r}")
        return value

    @field_validator("team")
    @classmethod
    def _team(cls, value: str | None) -> str | None:
        if value is not None and not _TEAM_ID.match(value):
            raise ValueError(f"{_EXPECTED_TEAM}, got {value!r}")
        return value


class FilesConfig(Strict):
    # A file a person shares in a thread is downloaded into its workspace (`.mm/uploads/<message ts>/`) when it
    # is at most this large; a larger one is refused with a line in the thread.
    maxMB: float = Field(default=20, gt=0)
    # The most one turn downloads, all its messages' files together; the files past it are refused the same way.
    maxTurnMB: float = Field(default=50, gt=0)
    # The most files one answer attaches (`[attach: path]` lines, workers.attachments), each at most maxMB.
    maxAttachments: int = Field(default=5, ge=0, le=20)


class WorkspacesConfig(Strict):
    root: str | None = None
    maxAgeDays: int = Field(default=14, ge=1)
    maxTotalMB: int | None = Field(default=None, ge=1)
    files: FilesConfig = Field(default_factory=FilesConfig)


class WorkerConfig(Strict):
    # Turns one worker process carries at once; they mostly wait on the model, so this is far above the cores
    # (about 50 keep pace on one core: docs/architecture.md, "What it carries, measured").
    concurrency: int = Field(default=50, ge=1, le=2000)
    # A turn running longer is stopped (the pool runs threads, which Celery's own time limits cannot stop).
    # Keep it under RabbitMQ's consumer_timeout (30 min by default) when RabbitMQ is the broker.
    turnTimeLimit: Duration = 1200.0
    # A worker renews its sessions' leases every third of this; a killed worker's turns resume after it.
    leaseSeconds: Duration = 30.0
    # How often housekeeping re-enqueues stranded work, releases leases and expires approvals.
    housekeepingSeconds: Duration = 30.0
    # The most tool calls of one model answer a turn carries out (the agent's maxToolCallsPerAnswer, which may
    # only lower it): each becomes a Slack message, an approval to ask, a command to run.
    maxToolCallsPerAnswer: int = Field(default=16, ge=1)


class BotConfig(Strict):
    # A bot renews its claim on each slash command, thread command or click it carries out after the ack every
    # third of this; one whose bot was killed is carried out by a bot (another replica, or the same restarted)
    # after it.
    claimSeconds: Duration = Field(default=30.0, ge=1.0)


class SchedulerConfig(Strict):
    # A job's tick missed while no scheduler ran is run once at start if it is at most this old, else recorded
    # as missed.
    missedGrace: Duration = 3600.0


class RetentionConfig(Strict):
    # A session idle longer than this many days loses its log, tool outputs, messages and workspace; the audit's
    # summary of its calls stays (None: kept until removed by hand).
    days: int | None = Field(default=None, ge=1)


FORGE_KINDS = ("github", "gitlab", "gitea")
# The forges known without a `forges` entry, by host.
KNOWN_FORGES = {"github.com": "github", "gitlab.com": "gitlab", "codeberg.org": "gitea"}
# Where a forge's token is by default (then MM_GIT_TOKEN, the token git pushes with), by kind.
FORGE_TOKEN_ENVS = {"github": "MM_GITHUB_TOKEN", "gitlab": "MM_GITLAB_TOKEN", "gitea": "MM_GITEA_TOKEN"}
# A host as a URL's netloc writes it: a DNS name or a bracketed IPv6 address, in lower case, with its port.
_HOST = re.compile(
    r"^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*|\[[0-9a-f:.]+\])(?::\d{1,5})?$"
)


def forge_host(netloc: str) -> str:
    """The key a host has in `forges`: in lower case, without the default port (`github.com:443` is github.com)."""
    return netloc.lower().removesuffix(":443")


class GitHubAppConfig(Strict):
    # The App's id (its settings page shows it) and, when known, its installation's (else it is looked up for
    # each repository's owner). The private key comes from the environment or from a file, never from here.
    id: int = Field(ge=1)
    installationId: int | None = Field(default=None, ge=1)
    privateKeyEnv: str | None = None
    privateKeyFile: str | None = None

    @model_validator(mode="after")
    def _one_key(self) -> GitHubAppConfig:
        if (self.privateKeyEnv is None) == (self.privateKeyFile is None):
            raise ValueError("expected exactly one of privateKeyEnv and privateKeyFile (where the App's key is)")
        return self


class ForgeConfig(Strict):
    """A forge the worker opens pull requests on, by host (`forges.<host>`)."""

    kind: str
    # The API's root (None: the kind's default for the host, api_url_for).
    apiUrl: str | None = None
    # The environment variable holding the token (None: MM_GITHUB_TOKEN, MM_GITLAB_TOKEN or MM_GITEA_TOKEN by
    # kind, else MM_GIT_TOKEN).
    tokenEnv: str | None = None
    # Who git says it is over HTTPS with the token (None: the kind's default, username_for).
    username: str | None = None
    # GitHub only: sign in as a GitHub App's installation rather than with a token.
    app: GitHubAppConfig | None = None

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value not in FORGE_KINDS:
            raise ValueError(f"expected github, gitlab or gitea, got {_describe(value, quote=True)}")
        return value

    @field_validator("apiUrl")
    @classmethod
    def _api_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            parts = urlsplit(value)
            ok = parts.scheme == "https" and bool(parts.hostname) and parts.username is None
            ok = ok and not parts.query and not parts.fragment
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(
                f"expected an https URL without credentials such as https://git.example.com, got {value!r}"
            )
        return value.rstrip("/")

    @model_validator(mode="after")
    def _app_on_github(self) -> ForgeConfig:
        if self.app is not None and self.kind != "github":
            raise ValueError("`app` is a GitHub App's: only a forge of kind github signs in as one")
        return self

    def api_url_for(self, host: str) -> str:
        """The API's root: `apiUrl`, else github.com's API, GitHub Enterprise's `/api/v3`, or the host itself."""
        if self.apiUrl:
            return self.apiUrl
        if self.kind == "github":
            return "https://api.github.com" if host == "github.com" else f"https://{host}/api/v3"
        return f"https://{host}"

    def username_for(self, git_username: str | None) -> str:
        """Who git says it is with the token: `username`, else what each kind expects of a token (Gitea's: the
        token's user, which MM_GIT_USERNAME names)."""
        if self.username:
            return self.username
        return {"github": "x-access-token", "gitlab": "oauth2"}.get(self.kind) or git_username or "mm"


class PullRequestConfig(Strict):
    # How the worker opens a pull request (a job's `push.pr`, a thread's `@mm pr`).
    draft: bool = True
    labels: list[str] = Field(default_factory=list)
    # Forge user names asked to review; one the forge does not know is left out (the pull request still opens).
    reviewers: list[str] = Field(default_factory=list)
    # How long the thread follows the pull request's checks after opening it, in minutes (0: not at all).
    followChecksMinutes: int = Field(default=30, ge=0, le=24 * 60)


class TeamConfig(Strict):
    """One workspace's (T…) or one Enterprise Grid organisation's (E…) settings (`teams.<id>`), laid over the top
    level's for the requests of that workspace (ServiceConfig.for_team)."""

    # Its channels over the top level's, whole entries replacing whole entries (its `default` too).
    channels: dict[str, ChannelConfig] = Field(default_factory=dict)
    # Its admins in place of the top level's (empty: its organisation's section's, else the top level's).
    admins: SlackIds = Field(default_factory=list)
    # Its jobs, run and posted by its installation: each gets `team: <id>` and is in ServiceConfig.jobs too.
    jobs: list[JobConfig] = Field(default_factory=list)


# The validation context of a file whose other problems are already found: it is refused whatever the sections
# say, and _cross_checks has said each of their conflicts with its line, so the models need not say them again.
_REFUSED = "refused"


class ServiceConfig(Strict):
    channels: dict[str, ChannelConfig] = Field(default_factory=dict)
    # Who may export the audit (`/mm audit`) and purge a thread (`/mm purge`): user or group ids.
    admins: SlackIds = Field(default_factory=list)
    budgets: BudgetsConfig = Field(default_factory=BudgetsConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    # The models a thread may pick by name (`@mm model=NAME …`), or a channel by default (`channels.<id>.model`).
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    approvals: ApprovalsConfig = Field(default_factory=ApprovalsConfig)
    jobs: list[JobConfig] = Field(default_factory=list)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    workspaces: WorkspacesConfig = Field(default_factory=WorkspacesConfig)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    bot: BotConfig = Field(default_factory=BotConfig)
    # The forges pull requests are opened on, by host (github.com, gitlab.com and codeberg.org are known).
    forges: dict[str, ForgeConfig] = Field(default_factory=dict)
    pullRequest: PullRequestConfig = Field(default_factory=PullRequestConfig)
    # Per-workspace sections by team (T…) or enterprise (E…) id, for an app installed in many workspaces.
    teams: dict[str, TeamConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _team_jobs_in_jobs(self, info: ValidationInfo) -> ServiceConfig:
        """Each job of a section gets its team and joins `jobs`, where every reader of the jobs (the scheduler,
        `/mm jobs`, doctor) finds it. A dumped config validated again (load_config's second pass, a test's round
        trip) already holds them in `jobs`: equal ones are not added twice."""
        if not self.teams:
            return self
        reported = bool(info.context and info.context.get(_REFUSED))
        teams: dict[str, TeamConfig] = {}
        jobs = list(self.jobs)
        by_name = {job.name: job for job in jobs}
        for team_id, team in self.teams.items():
            own: list[JobConfig] = []
            for job in team.jobs:
                if job.team not in (None, team_id) and not reported:
                    raise ValueError(f"teams.{team_id}.jobs: job {job.name!r} names another team, {job.team}")
                job = job.model_copy(update={"team": team_id})
                own.append(job)
                known = by_name.setdefault(job.name, job)
                if known is job:
                    jobs.append(job)
                elif known != job and not reported:
                    raise ValueError(f"teams.{team_id}.jobs: another job is already named {job.name!r}")
            teams[team_id] = team.model_copy(update={"jobs": own})
        # Frozen: set once here, before anything reads the config (AgentConfig._egress does the same).
        object.__setattr__(self, "teams", teams)
        object.__setattr__(self, "jobs", jobs)
        return self

    def for_team(self, team_id: str | None, enterprise_id: str | None = None) -> ServiceConfig:
        """The config as a workspace sees it: the top-level `channels` with its organisation's section's over them,
        then its own section's (whole entries replace whole entries, `default` included); the admins of its own
        section, else of its organisation's, else the top level's. Everything else is the top level's.

        Without a section for either id (a single workspace: no `teams` at all) it is this very config. A copy
        otherwise: a dict and a model copy, cheap enough for every request."""
        sections = [self.teams[i] for i in (enterprise_id, team_id) if i is not None and i in self.teams]
        if not sections:
            return self
        channels = dict(self.channels)
        for section in sections:
            channels.update(section.channels)
        admins = next((s.admins for s in reversed(sections) if s.admins), self.admins)
        return self.model_copy(update={"channels": channels, "admins": admins})

    def serves(self, team_id: str | None, enterprise_id: str | None) -> bool:
        """Whether an app installed through OAuth serves this workspace: it (or its org) has a `teams` section. An
        install link is public, so a workspace the operator did not name is refused, at install and after."""
        return any(key is not None and key in self.teams for key in (team_id, enterprise_id))

    def for_job(self, job: JobConfig) -> ServiceConfig:
        """The config as a job's workspace (or org) sees it: for_team of its `team`."""
        key = job.team
        return self.for_team(None, key) if key is not None and key.startswith("E") else self.for_team(key)

    def all_channels(self) -> list[ChannelConfig]:
        """Every channel entry the file holds: the top level's, then each section's (what a check of every
        channel walks; `channel()` and `channels` are one workspace's, see for_team)."""
        return [*self.channels.values(), *(c for team in self.teams.values() for c in team.channels.values())]

    def forge(self, host: str) -> ForgeConfig | None:
        """The forge at `host` (a URL's netloc): its `forges` entry, else a known forge's defaults."""
        return self.known_forges().get(forge_host(host))

    def known_forges(self) -> dict[str, ForgeConfig]:
        """Every forge by host: the known ones, and the config's entries over them."""
        known = {host: ForgeConfig(kind=kind) for host, kind in KNOWN_FORGES.items()}
        return known | {forge_host(host): forge for host, forge in self.forges.items()}

    def channel(self, channel_id: str) -> ChannelConfig:
        """The channel's own settings (this view's: a workspace's through for_team; else those of the `teams`
        section that holds it, for a caller that does not know the workspace: a channel is one workspace's), or
        the default's, or none at all. The default is this view's: a workspace's own `default` through for_team."""
        return (
            self.channels.get(channel_id)
            or self._in_section(channel_id)
            or self.channels.get("default")
            or ChannelConfig()
        )

    def _in_section(self, channel_id: str) -> ChannelConfig | None:
        """The channel's entry in a workspace's section, else in an org's (a workspace's is over its org's)."""
        if channel_id == "default" or not self.teams:
            return None
        ordered = sorted(self.teams.items(), key=lambda item: not item[0].startswith("T"))
        return next((team.channels[channel_id] for _key, team in ordered if channel_id in team.channels), None)

    def network_over(self, channel_id: str, job: JobConfig | None) -> NetworkConfig | None:
        """A thread's own egress policy over its agent's (None: the agent's `network`): the running job's, else
        its channel's. Each replaces the one under it whole: an allow-list is never merged with another."""
        if job is not None and job.network is not None:
            return job.network
        return self.channel(channel_id).network

    def network_policies(self, agent: AgentConfig) -> list[NetworkConfig]:
        """Every egress policy the config may run commands under: the agent's, then each channel's and job's own."""
        own = [c.network for c in self.all_channels()] + [j.network for j in self.jobs]  # jobs: the sections' too
        return [agent.egress, *(n for n in own if n is not None)]

    def model_names(self) -> str:
        """The names `model=` takes, for a person reading a refusal."""
        return ", ".join(f"`{name}`" for name in self.models) or "none is configured (`models` in the config)"


SERVICE_KEYS = frozenset(ServiceConfig.model_fields)


class FileConfig(AgentConfig, ServiceConfig):
    """The whole file: the reference's agent keys and the service's keys, side by side at the top level."""


# --- the result ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    path: Path | None
    agent: AgentConfig
    service: ServiceConfig
    database_url: str
    broker_url: str
    slack_api_url: str
    workspaces_root: Path
    slack_bot_token: str | None
    slack_signing_secret: str | None
    slack_app_token: str | None
    model_api_key: str | None
    # What the worker's git pushes with over HTTPS (jobs' and threads' branches): from the environment only.
    git_username: str | None = None
    git_token: str | None = None
    # The API keys of the `models` entries that name an `apiKeyEnv`, by entry name: from the environment only.
    model_api_keys: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # The forges' tokens by host (ServiceConfig.known_forges whose variable is set; not those signing in as a
    # GitHub App), and the Apps' private keys (PEM) by host: from the environment, or the file the config names.
    forge_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)
    forge_app_keys: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # The app's OAuth client, when it is installed in many workspaces (docs/slack-app.md): with both set, every
    # workspace's token comes from its installation (slackio.installations) and SLACK_BOT_TOKEN is not used.
    slack_client_id: str | None = None
    slack_client_secret: str | None = None
    # Where Slack sends the installer back (`/slack/oauth_redirect` on the bot); None: the app's own setting.
    slack_redirect_uri: str | None = None

    @property
    def oauth(self) -> bool:
        """Installed through OAuth in one or many workspaces (else one workspace's SLACK_BOT_TOKEN)."""
        return bool(self.slack_client_id and self.slack_client_secret)

    def missing_slack_secrets(self, socket_mode: bool) -> list[str]:
        """The environment variables `serve` needs and does not have (HTTP: signing secret; Socket: app token;
        a bot token unless the app is installed through OAuth)."""
        needed = {
            "SLACK_APP_TOKEN" if socket_mode else "SLACK_SIGNING_SECRET": (
                self.slack_app_token if socket_mode else self.slack_signing_secret
            ),
        }
        if not self.oauth:
            needed = {"SLACK_BOT_TOKEN": self.slack_bot_token} | needed
        return [name for name, value in needed.items() if not value]


def example_config() -> str:
    """The commented example that `mm-bot init` writes."""
    return resources.files("chatops").joinpath("example.yaml").read_text(encoding="utf-8")


def load_config(path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Read the file (`path`, else $MM_CONFIG, else ./mm.yaml when it exists) and the environment.

    A missing ./mm.yaml is fine (embedded defaults), a file named explicitly that does not exist is not.
    """
    env = os.environ if environ is None else environ
    explicit = path if path is not None else _env(env, "MM_CONFIG")
    file = Path(explicit if explicit is not None else DEFAULT_CONFIG_FILE)
    overlay = _overlay(env)
    if not file.exists():
        if explicit is not None:
            source = "MM_CONFIG" if path is None else "the config path"
            raise ConfigError([f"{file}: no such file ({source} names it; `mm-bot init` writes an example)"])
        where = _env(env, "MM_CONFIG_OVERLAY") or ""
        file_config, app_keys = _validated(overlay or {}, None, env, where, Path.cwd())
        source_path = None
    else:
        (file_config, app_keys), source_path = _load_file(file, env, overlay), file

    agent = AgentConfig.model_validate(file_config.model_dump(include=set(AgentConfig.model_fields)))
    if source_path is not None:
        agent = with_refs_from(agent, source_path.absolute().parent)
    overrides = {k: v for k, v in (("url", _env(env, "MM_MODEL_URL")), ("name", _env(env, "MM_MODEL"))) if v}
    if overrides:
        agent = agent.model_copy(update={"model": agent.model.model_copy(update=overrides)})
    service = ServiceConfig.model_validate(file_config.model_dump(include=set(SERVICE_KEYS)))
    key_env = agent.model.apiKeyEnv
    return Config(
        path=source_path,
        agent=agent,
        service=service,
        database_url=_env(env, "DATABASE_URL") or DEFAULT_DATABASE_URL,
        broker_url=_env(env, "CELERY_BROKER_URL") or DEFAULT_BROKER_URL,
        slack_api_url=_env(env, "SLACK_API_URL") or DEFAULT_SLACK_API_URL,
        workspaces_root=Path(_env(env, "MM_WORKSPACES") or service.workspaces.root or DEFAULT_WORKSPACES)
        .expanduser()
        .absolute(),
        slack_bot_token=_env(env, "SLACK_BOT_TOKEN"),
        slack_signing_secret=_env(env, "SLACK_SIGNING_SECRET"),
        slack_app_token=_env(env, "SLACK_APP_TOKEN"),
        model_api_key=_env(env, key_env) if key_env else None,
        git_username=_env(env, "MM_GIT_USERNAME"),
        git_token=_env(env, "MM_GIT_TOKEN"),
        model_api_keys={
            name: key
            for name, model in service.models.items()
            if model.apiKeyEnv and (key := _env(env, model.apiKeyEnv))
        },
        forge_tokens=_forge_tokens(service, env),
        forge_app_keys=app_keys,
        slack_client_id=_env(env, "SLACK_CLIENT_ID"),
        slack_client_secret=_env(env, "SLACK_CLIENT_SECRET"),
        slack_redirect_uri=_env(env, "SLACK_REDIRECT_URI"),
    )


def _forge_tokens(service: ServiceConfig, env: Mapping[str, str]) -> dict[str, str]:
    tokens = {}
    for host, forge in service.known_forges().items():
        if forge.app is not None:
            continue  # its tokens are the App's installation's, made as they are needed
        if forge.tokenEnv:
            token = _env(env, forge.tokenEnv)
        else:
            token = _env(env, FORGE_TOKEN_ENVS[forge.kind]) or _env(env, "MM_GIT_TOKEN")
        if token:
            tokens[host] = token
    return tokens


def _env(env: Mapping[str, str], name: str) -> str | None:
    # An empty variable is an unset one: `FOO= mm-bot serve` must not mean "connect to ''".
    return env.get(name) or None


# --- reading the file, with line numbers --------------------------------------------------------------------


def _overlay(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The file MM_CONFIG_OVERLAY names: keys laid over the config file's (the playground adds its people and
    its channel this way, leaving the person's own file untouched)."""
    name = _env(env, "MM_CONFIG_OVERLAY")
    if name is None:
        return None
    try:
        data = yaml.safe_load(Path(name).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError([f"{name}: cannot read the overlay (MM_CONFIG_OVERLAY): {e}"]) from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError([f"{name}: the overlay (MM_CONFIG_OVERLAY) must be a mapping of keys"])
    return data


def laid_over(base: dict[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """`overlay` laid over `base`: mappings merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = laid_over(merged[key], value)
        else:
            merged[key] = value
    return merged


def _validated(
    data: dict[str, Any], root: yaml.Node | None, env: Mapping[str, str], where: str, base: Path
) -> tuple[FileConfig, dict[str, str]]:
    """The file's config, and the GitHub Apps' private keys it points at (by host: secrets, kept out of it)."""
    problems = [(_line(root, loc), _render(loc, msg)) for loc, msg in _duplicate_keys(root)]
    problems += [(_line(root, loc), _render(loc, msg)) for loc, msg in _cross_checks(data, env)]
    texts, read_problems = _instruction_texts(data, base)
    problems += [(_line(root, loc), _render(loc, msg)) for loc, msg in read_problems]
    app_keys, key_problems = _app_keys(data, env, base)
    problems += [(_line(root, loc), _render(loc, msg)) for loc, msg in key_problems]
    config: FileConfig | None = None
    try:
        config = FileConfig.model_validate(data, strict=True, context={_REFUSED: bool(problems)})
    except ValidationError as e:
        problems += [(_line(root, loc), _render(loc, msg)) for loc, msg in _pydantic_problems(e)]
    if problems or config is None:
        ordered = sorted(dict.fromkeys(problems), key=lambda p: p[0])  # one line per problem, in file order
        raise ConfigError([f"{where}:{line}: {message}" for line, message in ordered])
    if texts:
        teams = {
            t: team.model_copy(update={"channels": _with_texts(team.channels, texts, ("teams", t, "channels"))})
            for t, team in config.teams.items()
        }
        config = config.model_copy(
            update={"channels": _with_texts(config.channels, texts, ("channels",)), "teams": teams}
        )
    return config, app_keys


def _with_texts(channels: dict[str, ChannelConfig], texts: dict[Loc, str], place: Loc) -> dict[str, ChannelConfig]:
    """The channels of one `channels` mapping with their instructions files' texts in place of the files."""
    return {
        k: c.model_copy(update={"instructions": texts[(*place, k)]}) if (*place, k) in texts else c
        for k, c in channels.items()
    }


def _instruction_texts(data: dict[str, Any], base: Path) -> tuple[dict[Loc, str], list[tuple[Loc, str]]]:
    """The texts of the channels' `instructions: {file: PATH}`, read now (at each load and reload): a file that
    cannot be used is a problem of the config, reported with the others, not of some later turn."""
    texts: dict[Loc, str] = {}  # by the place of the channel: ("channels", id) or ("teams", team, "channels", id)
    problems: list[tuple[Loc, str]] = []
    for place, channel_id, channel in _channels(data):
        name = _get(channel, "instructions", "file")
        if not isinstance(channel_id, str) or not isinstance(name, str):
            continue  # a wrong shape is the validation's to say
        loc: Loc = (*place, channel_id, "instructions", "file")
        path = base / name
        try:
            # Non-blocking, then checked to be a file: a named pipe put there would hold the load for ever.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    problems.append((loc, f"{path} is not a regular file"))
                    continue
                data_read = f.read(MAX_INSTRUCTIONS_BYTES + 1)
            if len(data_read) > MAX_INSTRUCTIONS_BYTES:
                problems.append((loc, f"{path} is longer than {MAX_INSTRUCTIONS_BYTES:,} bytes"))
                continue
            texts[(*place, channel_id)] = data_read.decode("utf-8")
        except UnicodeDecodeError:
            problems.append((loc, f"{path} is not UTF-8 text"))
        except OSError as e:
            problems.append((loc, f"cannot read {path}: {e.strerror or e}"))
    return texts, problems


MAX_KEY_BYTES = 64_000  # a PEM private key is a few kilobytes


def _app_keys(data: dict[str, Any], env: Mapping[str, str], base: Path) -> tuple[dict[str, str], list[tuple[Loc, str]]]:
    """The GitHub Apps' private keys by host: from `privateKeyEnv` (unset: the forge says so when it is used, for
    the bot's processes read this config without the worker's secrets), or read now from `privateKeyFile`."""
    keys: dict[str, str] = {}
    problems: list[tuple[Loc, str]] = []
    for host, forge in _items(data.get("forges")):
        app = _get(forge, "app")
        if not isinstance(host, str) or not isinstance(app, dict):
            continue  # a wrong shape is the validation's to say
        loc: Loc = ("forges", host, "app")
        name, file = app.get("privateKeyEnv"), app.get("privateKeyFile")
        if isinstance(name, str) and isinstance(file, str):
            continue  # both: the validation says to pick one
        pem = _env(env, name) if isinstance(name, str) else None
        if isinstance(file, str):
            path = base / file
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a named pipe must not hold the load
                with os.fdopen(fd, "rb") as f:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        problems.append(((*loc, "privateKeyFile"), f"{path} is not a regular file"))
                        continue
                    pem = f.read(MAX_KEY_BYTES).decode("utf-8")
            except (OSError, UnicodeDecodeError) as e:
                reason = e.strerror if isinstance(e, OSError) and e.strerror else "not UTF-8 text"
                problems.append(((*loc, "privateKeyFile"), f"cannot read {path}: {reason}"))
                continue
            if "-----BEGIN" not in pem:
                problems.append(((*loc, "privateKeyFile"), f"{path} holds no PEM private key (-----BEGIN …)"))
                continue
        if pem:
            keys[forge_host(host)] = pem
    return keys, problems


def _load_file(
    file: Path, env: Mapping[str, str], overlay: dict[str, Any] | None = None
) -> tuple[FileConfig, dict[str, str]]:
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"{file}: cannot read the file: {e}"]) from None
    try:
        # The nodes carry the line numbers, the data is what gets validated.
        root, data = read_yaml(text)
    except YamlProblem as e:
        raise ConfigError([f"{file}:{e.line}: {e.problem}" if e.line else f"{file}: {e.problem}"]) from None

    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"{file}:1: expected a mapping of keys at the top level, got {_describe(data)}"])
    # A problem in a key the overlay brought is reported at the line of the file's nearest key.
    base = file.absolute().parent  # an instructions file is named relative to the config that names it
    return _validated(laid_over(data, overlay) if overlay else data, root, env, str(file), base)


Loc = tuple[str | int, ...]


def _path(loc: Loc) -> str:
    """`teams.T0123ABCD.jobs`: a place in the file as the problems name it."""
    return _render(loc, "").removesuffix(": ")


def _render(loc: Loc, message: str) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return f"{path}: {message}" if path else message


def _line(root: yaml.Node | None, loc: Loc) -> int:
    """The 1-based line of the deepest node that `loc` reaches (a key's own line for mapping entries)."""
    node, line = root, (root.start_mark.line + 1 if root is not None else 1)
    for part in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    child, line = value, key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line


def _duplicate_keys(node: yaml.Node | None, loc: Loc = ()) -> list[tuple[Loc, str]]:
    # PyYAML keeps the last of two equal keys without a word; the first one was somebody's setting.
    found: list[tuple[Loc, str]] = []
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if name is None:
                continue
            if name in first_line:
                found.append(((*loc, name), f"duplicate key (first set on line {first_line[name]})"))
            first_line.setdefault(name, key.start_mark.line + 1)
            found += _duplicate_keys(value, (*loc, name))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found += _duplicate_keys(item, (*loc, i))
    return found


_EXPECTED = {
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a mapping of keys",
    "model_type": "expected a mapping of keys",
    "model_attributes_type": "expected a mapping of keys",
}


def _pydantic_problems(error: ValidationError) -> list[tuple[Loc, str]]:
    problems = []
    for err in error.errors():
        loc, kind, ctx = tuple(err["loc"]), err["type"], err.get("ctx") or {}
        if loc and loc[-1] == "[key]":  # pydantic's marker for a mapping's key rather than its value
            problems.append((loc[:-1], f"expected a string as the key, got {_describe(err['input'])}"))
        elif kind == "invalid_key":  # the same, in a model's own mapping (the top level, `model`, ...)
            problems.append((loc, f"expected a string as the key, got {_describe(err['input'])}"))
        elif kind == "extra_forbidden":
            problems.append((loc, _unknown_key(loc)))
        elif kind == "missing":
            problems.append((loc, "required key is missing"))
        elif kind in _EXPECTED:
            problems.append((loc, f"{_EXPECTED[kind]}, got {_describe(err['input'])}"))
        elif kind == "value_error":
            problems.append((loc, str(ctx.get("error", err["msg"]))))
        elif kind == "literal_error":
            problems.append((loc, f"expected one of {ctx.get('expected')}, got {_describe(err['input'], True)}"))
        elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
            bound = next(iter(ctx.values()), "")
            sign = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
            problems.append((loc, f"expected a number {sign[kind]} {bound}, got {_describe(err['input'], True)}"))
        else:
            problems.append((loc, err["msg"]))
    return problems


def _unknown_key(loc: Loc) -> str:
    """`unknown key (did you mean "yolo"?)`, the suggestion taken from the keys valid at that place."""
    model = _type_at(loc[:-1])
    valid = list(getattr(model, "model_fields", {}))
    if not valid:
        return "unknown key"
    close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.6)
    if close:
        return f'unknown key (did you mean "{close[0]}"?)'
    if len(valid) > 8:  # the top level: too many to list usefully
        return "unknown key (docs/configuration.md lists the keys)"
    return f"unknown key (expected one of: {', '.join(valid)})"


def _type_at(loc: Loc) -> Any:
    """The type the file's structure has at `loc`: fields name models, dict keys and list indexes name items."""
    current: Any = FileConfig
    for part in loc:
        current = _unwrap_optional(current)
        fields = getattr(current, "model_fields", None)
        if fields is not None:
            if part not in fields:
                return None
            current = fields[part].annotation
        else:
            args = getattr(current, "__args__", ())
            if not args:
                return None
            current = args[-1]  # dict[str, X] and list[X] both end with the item type
    return _unwrap_optional(current)


def _unwrap_optional(annotation: Any) -> Any:
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return next((a for a in annotation.__args__ if a is not type(None)), annotation)
    return annotation


def _cross_checks(data: dict[str, Any], env: Mapping[str, str]) -> list[tuple[Loc, str]]:
    """What no single field can know: uniqueness across entries, and the environment the file points at.

    It reads the raw data (shapes checked as it goes) so that these problems are reported together with the
    type errors, not one round of fixes later.
    """
    problems: list[tuple[Loc, str]] = []
    owner: dict[str, str] = {}
    for name, server in _items(_get(data, "lsp", "servers")):
        for ext in _get(server, "extensions") if isinstance(_get(server, "extensions"), list) else ():
            if ext in owner:
                problems.append((("lsp", "servers", name, "extensions"), f"{ext} is already served by {owner[ext]}"))
            else:
                owner.setdefault(ext, name)
    for team_id, _ in _items(data.get("teams")):
        if isinstance(team_id, str) and not _TEAM_ID.match(team_id):
            problems.append((("teams", team_id), f"{_EXPECTED_TEAM} as the key"))
    for loc, channel_id, _ in _channels(data):
        if isinstance(channel_id, str) and channel_id != "default" and not _CHANNEL_ID.match(channel_id):
            problems.append(((*loc, channel_id), "expected `default` or a channel id such as C0123ABCD as the key"))
    names: dict[str, Loc] = {}  # where each name's first job is
    for loc, job in _jobs(data):
        name = _get(job, "name")
        if isinstance(name, str) and name in names:
            # Where the other one is, when it is in another list (a team's section and the top level's, say).
            other = "" if names[name][:-1] == loc[:-1] else f" ({_path(names[name])})"
            problems.append(((*loc, "name"), f"another job is already named {name!r}{other}"))
        if isinstance(name, str):
            names.setdefault(name, loc)
        if isinstance(job, dict) and not _get(job, "prompt") and not _get(job, "skill"):
            problems.append((loc, "a job needs a prompt, or a skill to follow (or both)"))
        agent = _get(job, "agent")
        if isinstance(agent, str) and agent not in dict(_items(data.get("mmConfigs"))):
            known = ", ".join(str(k) for k, _ in _items(data.get("mmConfigs"))) or "none is configured"
            problems.append(((*loc, "agent"), f"no mmConfigs entry is named {agent!r} ({known})"))
        if isinstance(_get(job, "skill"), str) and not data.get("skillsDir"):
            problems.append(((*loc, "skill"), "a skill needs `skillsDir`, where the skills are"))
    models = dict(_items(data.get("models")))
    for name, model in models.items():
        if isinstance(name, str) and not _MODEL_NAME.match(name):
            problems.append((("models", name), "expected a name of letters, digits, '.', '_', ':' or '-' as the key"))
        model_key_env = _get(model, "apiKeyEnv")
        if isinstance(model_key_env, str) and model_key_env and not _env(env, model_key_env):
            problems.append((("models", name, "apiKeyEnv"), f"the environment variable {model_key_env} is not set"))
    for loc, channel_id, channel in _channels(data):
        model = _get(channel, "model")
        if isinstance(model, str) and model not in models:
            known = ", ".join(str(k) for k in models) or "none is configured"
            problems.append(((*loc, channel_id, "model"), f"no models entry is named {model!r} ({known})"))
    for host, _ in _items(data.get("forges")):
        if isinstance(host, str) and not _HOST.match(host):
            problems.append(
                (
                    ("forges", host),
                    "expected a host as a URL writes it, in lower case, such as git.example.com or "
                    "git.example.com:8443 (no scheme, no path)",
                )
            )
    key_env = _get(data, "model", "apiKeyEnv")
    if isinstance(key_env, str) and key_env and not _env(env, key_env):
        problems.append((("model", "apiKeyEnv"), f"the environment variable {key_env} is not set"))
    return problems + _teams(data) + _approval_times(data) + _priced(data, models) + _enough_people(data)


def _channels(data: dict[str, Any]) -> list[tuple[Loc, Any, Any]]:
    """Every channel entry of the file, with the place of its `channels` mapping: the top level's, then each
    `teams` section's."""
    places: list[tuple[Loc, Any]] = [(("channels",), data.get("channels"))]
    places += [(("teams", t, "channels"), _get(team, "channels")) for t, team in _items(data.get("teams"))]
    return [(loc, channel_id, channel) for loc, mapping in places for channel_id, channel in _items(mapping)]


def _jobs(data: dict[str, Any]) -> list[tuple[Loc, Any]]:
    """Every job of the file with its place: the top level's `jobs`, then each `teams` section's."""
    lists: list[tuple[Loc, Any]] = [(("jobs",), data.get("jobs"))]
    lists += [(("teams", t, "jobs"), _get(team, "jobs")) for t, team in _items(data.get("teams"))]
    return [((*loc, i), job) for loc, jobs in lists for i, job in enumerate(jobs if isinstance(jobs, list) else ())]


def _teams(data: dict[str, Any]) -> list[tuple[Loc, str]]:
    """A channel is one workspace's: two workspaces' sections (or two organisations') may not both configure it,
    nor may a job of one post in a channel another's configures. A workspace's section may configure a channel
    its organisation's does: that is its overlay (which workspaces an organisation holds, the file cannot tell)."""
    problems: list[tuple[Loc, str]] = []
    owner: dict[tuple[str, str], str] = {}  # (T or E, channel id) → the section configuring it
    for team_id, team in _items(data.get("teams")):
        for channel_id, _ in _items(_get(team, "channels")):
            if not isinstance(team_id, str) or not isinstance(channel_id, str) or channel_id == "default":
                continue
            first = owner.setdefault((team_id[:1], channel_id), team_id)
            if first != team_id:
                problems.append(
                    (
                        ("teams", team_id, "channels", channel_id),
                        f"teams.{first} configures this channel already: a channel is one workspace's",
                    )
                )
    for loc, job in _jobs(data):
        team, channel = _get(job, "team"), _get(job, "channel")
        if loc[0] == "teams":
            section = loc[1]
            if isinstance(section, str) and isinstance(team, str) and team != section and _TEAM_ID.match(team):
                problem = f"a job of teams.{section} runs in that team: leave `team` out, or write {section}"
                problems.append(((*loc, "team"), problem))
                continue
            team = section
        if not isinstance(team, str) or not isinstance(channel, str):
            continue
        other = owner.get((team[:1], channel), team)
        if other != team:
            problems.append(
                ((*loc, "channel"), f"teams.{other} configures {channel}: a job of {team} cannot post there")
            )
    return problems


def _approval_times(data: dict[str, Any]) -> list[tuple[Loc, str]]:
    """A reminder or an escalation after the call expired would never come; an escalation needs someone to go to."""
    problems: list[tuple[Loc, str]] = []
    approvals: dict[str, Any] = data["approvals"] if isinstance(data.get("approvals"), dict) else {}
    times: dict[str, float | None] = {}
    for key in ("timeout", "remindAfter", "escalateAfter"):
        try:
            times[key] = parse_duration(approvals[key]) if approvals.get(key) not in (None, "never") else None
        except (KeyError, ValueError):  # unset, or wrong (the field's own check says so)
            times[key] = None
    timeout = times["timeout"] if "timeout" in approvals else ApprovalsConfig().timeout
    for key in ("remindAfter", "escalateAfter"):
        after = times[key]
        if after is not None and timeout is not None and after >= timeout:
            problems.append(
                (("approvals", key), f"it must be shorter than approvals.timeout ({approvals.get('timeout', '30m')})")
            )
    if times["escalateAfter"] is not None and not approvals.get("escalateTo"):
        problems.append((("approvals", "escalateTo"), "escalateAfter needs someone to escalate to: user or group ids"))
    return problems


def _enough_people(data: dict[str, Any]) -> list[tuple[Loc, str]]:
    """A rule asking N people that accepts fewer than N named users (and no group) could never be approved: its
    calls would wait for nobody. Where it takes the channels' approvers, each channel is checked."""
    approvals = data.get("approvals")
    rules = _get(approvals, "policies") if isinstance(approvals, dict) else None
    channels = [
        (f"channel {c}'s approvers" + (f" in {_path(loc[:2])}" if loc[0] == "teams" else ""), _get(ch, "approvers"))
        for loc, c, ch in _channels(data)
    ]
    problems: list[tuple[Loc, str]] = []
    for i, rule in enumerate(rules if isinstance(rules, list) else ()):
        ask = _get(rule, "ask")
        if isinstance(ask, bool) or not isinstance(ask, int) or ask < 2:
            continue
        named = _get(rule, "approvers")
        where = [("its approvers", named)] if named else channels
        for whose, ids in where:
            count = len(set(ids)) if isinstance(ids, list) else 0
            # None at all is another matter: every call there is refused at once, saying who can configure them.
            if isinstance(ids, list) and not any(str(a).startswith("S") for a in ids) and 0 < count < ask:
                people = "1 person" if count == 1 else f"{count} people"
                problems.append(
                    (
                        ("approvals", "policies", i, "ask"),
                        f"it asks {ask} different people, but {whose} are {people} and no group: "
                        "its calls could never be approved",
                    )
                )
    return problems


def _priced(data: dict[str, Any], models: dict[Any, Any]) -> list[tuple[Loc, str]]:
    """A money budget counts the cost of every answer: each model a thread may use needs its price."""
    places: list[tuple[Loc, Any]] = [(("budgets",), data.get("budgets"))]
    places += [((*loc, c, "budgets"), _get(channel, "budgets")) for loc, c, channel in _channels(data)]
    places += [((*loc, "budgets"), _get(job, "budgets")) for loc, job in _jobs(data)]
    costly = [
        loc
        for loc, budgets in places
        if isinstance(budgets, dict) and ({"threadCost", "channelDayCost"} & set(budgets))
    ]
    if not costly:
        return []
    unpriced = [("model",)] if _get(data, "model", "price") is None else []
    unpriced += [("models", name) for name, model in models.items() if _get(model, "price") is None]
    where = _render(costly[0], "").removesuffix(": ")
    return [
        ((*loc, "price"), f"{where} sets a money budget: every model needs its price, per million tokens")
        for loc in unpriced
    ]


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _items(data: Any) -> list[tuple[Any, Any]]:
    return list(data.items()) if isinstance(data, dict) else []


def _describe(value: Any, quote: bool = False) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return str(value).lower() if quote else "a boolean"
    if isinstance(value, str):
        return f'"{value}"' if quote else "a string"
    if isinstance(value, int):
        return str(value) if quote else "an integer"
    if isinstance(value, float):
        return str(value) if quote else "a number"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__
