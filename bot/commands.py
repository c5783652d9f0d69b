"""Thread commands: exact keywords in a message addressed to the bot, and the `/mm` slash command.

Slack offers no slash commands in thread replies, so in a thread the commands are words: `@mm stop`. Only the
whole message counts (`@mm help me read this` is a request, not `help`), and only when it is addressed to the
bot (it mentions the bot first, or it is a direct message): in a channel thread, "stop" said to a colleague
is talk. In channels, `/mm <command>` works on the person's latest session there.

Commands that change the conversation (`new`, `compact`, `ask`, and the log record of `yolo`) are inbox rows:
the worker carries them out in order with the messages (chatops.schema.InboxCommand). The others act at once:
`stop` asks the running turn to stop, `status` and `help` answer, `repo` sets the thread's repository before
its first turn, `yolo` sets the session's own setting, `budget` shows the thread's budgets or sets its own
(bot.budgets).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Engine

from bot.admin import AdminCommands, is_admin_command
from bot.approvals import MAY_NOT_STOP, PUSH_UNAVAILABLE, ClickHandler, may_stop
from bot.authorize import Approvers
from bot.budgets import BudgetCommand
from bot.jobs import JobCommands, is_job_command
from bot.steps import NoSteps, Steps, courtesy
from chatops import pull_requests
from chatops.config import Config, ServiceConfig, is_branch_name
from chatops.inbox import Recorded, has_message, has_messages, record_message, request_stop, session_of
from chatops.queries import (
    instructions_used,
    latest_session,
    log_length,
    network_used,
    pending_approvals,
    session_summary,
    tokens_used,
)
from chatops.reload import ConfigFile
from chatops.repos import RepoRefused, check_branch, check_repo
from chatops.schema import InboxCommand, SessionStatus
from chatops.store import ensure_session, set_model, set_repo, set_yolo, thread_model
from chatops.teams import NOWHERE, Team, session_team
from slackio.approval_message import JOB_PROMPT, line_of, mention
from slackio.mrkdwn import Mrkdwn, mrkdwn_of
from slackio.slack_out import SlackOut
from workers.asking import thread_asking
from workers.egress import thread_network
from workers.workspaces import public_url

log = logging.getLogger("mm.bot.commands")

SLASH_COMMAND = "/mm"

HELP = """Say these in a thread, after mentioning me (in a direct message, without): \
`new` (a fresh conversation; the workspace stays), `compact` (summarise the earlier conversation), \
`stop` (stop the running turn), `status` (this session's state), `ask AGENT PROMPT` (ask one of the \
configured agents: {agents}), `yolo on` / `yolo off` (approvers: run calls without asking, or ask again), \
`repo URL [BRANCH]` (before the first turn: the repository this thread works on), `budget [TOKENS]` (this \
thread's budgets, or its token budget: anyone in it may lower it, an approver raise it), `push [BRANCH]` \
(approvers: the workspace's changes to a branch of the repository), `pr [TITLE]` (approvers: open or update \
the thread's pull request; once it has one, anyone: its state, review and checks), `help`. A request may start with \
`model=NAME` (one of: {models}), and in a new thread `repo=URL` and `branch=NAME`. In a channel, \
`/mm COMMAND` does the same for your latest session there, and `/mm PROMPT` starts a new thread. \
`/mm jobs` lists the scheduled jobs; `/mm job run|pause|resume NAME` (approvers) steers one. \
`/mm audit [SINCE]` and `/mm purge LINK` are for the bot's admins."""
NO_SESSION = "There is no session here yet: mention me with a request to start one."
STOP_ASKED = Mrkdwn("⏹ <@{user}> asked me to stop.")
NOTHING_RUNS = "Nothing is running here."
YOLO_ON = Mrkdwn(
    "⚡ <@{user}> switched this thread to yolo: from the next turn on, I run commands and edits without asking. "
    "`yolo off` asks again."
)
YOLO_OFF = Mrkdwn("🔐 <@{user}> switched yolo off: from the next turn on, I ask before commands and edits again.")
REPO_SET = "📦 This thread works on {url}{branch}."
REPO_USAGE = "Say `repo URL [BRANCH]`, with an https URL the channel allows."
REPO_REFUSED = "I can't work on that repository: {reason}"
REPO_LATE = (
    "The repository is chosen before the first turn; this thread has started. Start a new thread for another one."
)
UNKNOWN_AGENT = "There is no agent named `{name}`; the agents are: {agents}."
NO_AGENTS = "No agents are configured to ask (mmConfigs in the config)."
FILES_NOT_TAKEN = (
    "I did not take the files on that message ({names}): only a request gives the agent files. Share them again "
    "with one."
)
ASK_USAGE = "Say `ask AGENT PROMPT`, for example `ask reviewer look at the last commit`."
QUEUED_COMMAND = "`{command}` is queued: I do it after the current turn."
STARTED = Mrkdwn("<@{user}> asked: {prompt}")
STARTED_FOR_REPO = Mrkdwn("<@{user}> started a thread for a repository.")
MAX_TITLE = 200  # of a pull request's title given with `pr TITLE`
NETWORK_STATUS_HOSTS = 10  # hosts `status` names of each kind (reached, refused)
PUSH_BRANCH = "`{branch}` is not a branch name I can push to (letters, digits, `._/-`)."
SLASH_NEW = "Say `/mm PROMPT` to start a new thread, or `@mm new` in a thread to start its conversation again."

UNKNOWN_MODEL = (
    "There is no model named `{name}`; the models are: {models}. Nothing was run: say it again with one of them."
)
OPTION_TWICE = "`{key}=` is given twice. Nothing was run."
OPTION_REFUSED = "I can't work on that repository: {reason} Nothing was run."
BRANCH_WITHOUT_REPO = "`branch=` needs a repository: give `repo=URL` too (this channel has none). Nothing was run."
MODEL_SET = "🧠 This thread uses the model `{name}`."
OPTIONS = ("repo", "branch", "model")  # what a request may start with, as `key=value`

_KEYWORD = re.compile(r"^(new|compact|stop|status|help)$", re.IGNORECASE)
_YOLO = re.compile(r"^yolo\s+(on|off)$", re.IGNORECASE)
_ASK = re.compile(r"^ask(?:\s+(\S+)(?:\s+(.+))?)?$", re.IGNORECASE | re.DOTALL)
_REPO = re.compile(r"^repo(?:\s+(\S+)(?:\s+(\S+))?)?$", re.IGNORECASE)
_PUSH = re.compile(r"^push(?:\s+(\S+))?$", re.IGNORECASE)
_PULL_REQUEST = re.compile(r"^pr(?:\s+(.+))?$", re.IGNORECASE | re.DOTALL)
_BUDGET = re.compile(r"^budget(?:\s+(\S+))?$", re.IGNORECASE)


_OPTION = re.compile(rf"^({'|'.join(OPTIONS)})=(\S+)(?:\s+|$)", re.IGNORECASE)


@dataclass(frozen=True)
class Command:
    name: (
        str  # new, compact, stop, status, help, yolo, ask, repo, push, pr, budget; options (args: `key=value`…, prompt)
    )
    args: tuple[str, ...] = ()


def parse(text: str) -> Command | None:
    """The command the whole text is, or None for a request to the agent. A request that starts with options
    (`repo=URL branch=NAME model=NAME`, only these keys, only at the start) is the `options` command: its
    args are the options, then the rest of the text (the prompt, maybe empty)."""
    text = text.strip()
    options, rest = [], text
    while m := _OPTION.match(rest):
        options.append(f"{m.group(1).lower()}={m.group(2)}")
        rest = rest[m.end() :]
    if options:
        return Command("options", (*options, rest))
    if m := _KEYWORD.match(text):
        return Command(m.group(1).lower())
    if m := _YOLO.match(text):
        return Command("yolo", (m.group(1).lower(),))
    if m := _ASK.match(text):
        return Command("ask", tuple(g.strip() for g in m.groups() if g))
    if m := _REPO.match(text):
        return Command("repo", tuple(g for g in m.groups() if g))
    if m := _PUSH.match(text):
        return Command("push", tuple(g for g in m.groups() if g))
    if m := _PULL_REQUEST.match(text):
        return Command("pr", tuple(g.strip() for g in m.groups() if g and g.strip()))
    if m := _BUDGET.match(text):
        return Command("budget", tuple(g for g in m.groups() if g))
    return None


def _options_of(command: Command) -> tuple[dict[str, str] | str, str]:
    """The `options` command's options by key (or why they are refused: one given twice), and its prompt."""
    *tokens, prompt = command.args
    options: dict[str, str] = {}
    for token in tokens:
        key, value = token.split("=", 1)
        if key in options:
            return OPTION_TWICE.format(key=key), prompt
        options[key] = value
    return options, prompt


@dataclass(frozen=True)
class Where:
    """The message or command a command came with: its thread (None for `/mm` outside one), who, and the ts;
    `files`, what Slack said of the files the message carries (bot.shapes.shared_files): a request with inline
    options keeps them with its prompt, as any message does (a slash command carries none)."""

    channel: str
    thread_ts: str | None
    message_ts: str
    user: str
    team: str | None = None
    assistant_thread: bool = False
    files: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    # The workspace and org the app's installation answers it from (chatops.teams), kept on a session it makes.
    slack_team: str | None = None
    enterprise: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What to answer: `public` goes to the thread for everyone, `private` to the person alone; `enqueue` the
    session to hand to the workers."""

    public: str | None = None  # Mrkdwn where it holds mentions: a plain str reaches Slack escaped
    private: str | None = None
    enqueue: str | None = None


ROOT = "root_ts"  # the step of `/mm PROMPT` that posted the new thread's root: its ts
SAID = "said"  # the step of `/mm PROMPT` (an `ask`, a `repo`) that posted its outcome in the new thread
STOPPED = "stopped"  # the step of `stop` that asked the turn to stop: "yes", or "no" (nothing ran)
ANNOUNCED = "announced"  # the step that posted a command's line for everyone


class Commands:
    def __init__(
        self,
        engine: Engine,
        config_file: ConfigFile,
        approvers: Approvers,
        enqueue: Any,
        secrets: Callable[[], Sequence[str]],
        jobs: JobCommands | None = None,
        clicks: ClickHandler | None = None,
        admin: AdminCommands | None = None,
    ) -> None:
        self.engine, self.config_file, self.approvers, self.enqueue = engine, config_file, approvers, enqueue
        self.secrets, self.jobs, self.clicks, self.admin = secrets, jobs, clicks, admin

    @property
    def config(self) -> Config:
        return self.config_file.current()

    def agents(self) -> str:
        return ", ".join(f"`{n}`" for n in self.config.agent.mmConfigs) or "none configured"

    async def run(self, slack: SlackOut, command: Command, where: Where, steps: Steps | None = None) -> Outcome:
        """Carry out a command given in a thread (where.thread_ts is the thread). `steps`: what an earlier
        attempt at the same request did. Files on a command's message are not taken (only a prompt kept with
        inline options keeps them): the person is told so, never left to think the agent has them."""
        outcome = await self._carry_out(slack, command, where, steps)
        if not where.files or (command.name == "options" and outcome.enqueue is not None):
            return outcome  # the prompt was kept, and its files with it
        names = ", ".join(f"`{f.get('name') or f.get('id') or '?'}`"[:100] for f in where.files)
        note = FILES_NOT_TAKEN.format(names=names)
        return replace(outcome, private=f"{outcome.private}\n{note}" if outcome.private else note)

    async def _carry_out(self, slack: SlackOut, command: Command, where: Where, steps: Steps | None = None) -> Outcome:
        assert where.thread_ts is not None
        steps = steps or NoSteps(self.engine)
        session = await asyncio.to_thread(session_of, self.engine, where.channel, where.thread_ts)
        name = command.name
        if name == "help":
            return Outcome(private=HELP.format(agents=self.agents(), models=self.config.service.model_names()))
        if name == "repo":
            return await asyncio.to_thread(self._repo, command, where, session)
        if name == "options":
            return await self._options(command, where, session)
        if name == "ask":
            refusal = self._ask_refusal(command)
            if refusal:
                return Outcome(private=refusal)
            agent, prompt = command.args
            return await self._record(where, InboxCommand.ASK, json.dumps({"agent": agent, "prompt": prompt}))
        if session is None:
            return Outcome(private=NO_SESSION)
        if name == "stop":
            if steps.done(STOPPED) is None and not await may_stop(
                self.engine, self.approvers, slack.client, where.channel, session, where.user
            ):
                return Outcome(private=MAY_NOT_STOP)
            # Kept with the stop itself: a replay says what this attempt did, not that nothing runs any more.
            stopped = await steps.take(STOPPED, lambda conn: "yes" if request_stop(conn, session) else "no")
            if stopped != "yes":
                return Outcome(private=NOTHING_RUNS)
            return Outcome(public=STOP_ASKED.format(user=where.user), enqueue=session)
        if name == "status":
            return Outcome(private=await asyncio.to_thread(self.status, session))
        if name == "push":
            return await self._push(slack, command, where, session)
        if name == "pr":
            return await self._pull_request(slack, command, where, session)
        if name == "budget":
            said, private = await BudgetCommand(self.engine, lambda: self.config, self.approvers).answer(
                slack.client, where.channel, session, where.user, command.args[0] if command.args else None
            )
            return Outcome(public=said, private=private)
        if name == "yolo":
            place = await asyncio.to_thread(session_team, self.engine, session)
            refusal = await self.approvers.may_approve(
                slack.client, where.channel, where.user, None, "switch yolo", place=place
            )
            if refusal:
                return Outcome(private=refusal)
            on = command.args[0] == "on"
            await asyncio.to_thread(set_yolo, self.engine, session, on)
            recorded = await self._record(where, InboxCommand.YOLO, "on" if on else "off")
            return Outcome(public=(YOLO_ON if on else YOLO_OFF).format(user=where.user), enqueue=recorded.enqueue)
        return await self._record(where, InboxCommand(name), "")

    async def _push(self, slack: SlackOut, command: Command, where: Where, session: str) -> Outcome:
        branch = command.args[0] if command.args else None
        if branch is not None and not is_branch_name(branch):
            return Outcome(private=PUSH_BRANCH.format(branch=branch[:100]))
        if self.clicks is None:
            return Outcome(private=PUSH_UNAVAILABLE)
        refusal = await self.clicks.push(slack, session, where.channel, where.user, branch)
        return Outcome(private=refusal) if refusal else Outcome()

    async def _pull_request(self, slack: SlackOut, command: Command, where: Where, session: str) -> Outcome:
        """`pr`: the status of the thread's pull request when it has an open one (a job run's thread: its job's),
        else (and `pr TITLE` always) push and open or update it, as an approver's push."""
        title = " ".join(command.args[0].split())[:MAX_TITLE] if command.args else None
        if self.clicks is None:
            return Outcome(private=PUSH_UNAVAILABLE)
        pull = await asyncio.to_thread(pull_requests.of_session, self.engine, session) if title is None else None
        # A thread's own open one (or one being opened) is shown; a closed or refused one is not in the way of the
        # next (its push opens another, or tries again).
        # A job run's thread shows its job's, whatever its state: the job, not the thread, opens them.
        if pull is not None and (pull.shows_status or pull.owner.startswith("job:")):
            refusal = await self.clicks.show_pull_request(session)
        else:
            refusal = await self.clicks.push(slack, session, where.channel, where.user, None, True, title)
        return Outcome(private=refusal) if refusal else Outcome()

    def _ask_refusal(self, command: Command) -> str | None:
        if len(command.args) < 2:
            return ASK_USAGE
        if not self.config.agent.mmConfigs:
            return NO_AGENTS
        if command.args[0] not in self.config.agent.mmConfigs:
            return UNKNOWN_AGENT.format(name=command.args[0][:100], agents=self.agents())
        return None

    async def _record(self, where: Where, command: InboxCommand, argument: str) -> Outcome:
        recorded = await self._keep(where, argument, command)
        if not recorded.new:
            return Outcome()
        busy = QUEUED_COMMAND.format(command=command.value) if recorded.busy and command != InboxCommand.YOLO else None
        return Outcome(private=busy, enqueue=recorded.session_id)

    async def _keep(self, where: Where, text: str, command: InboxCommand | None = None) -> Recorded:
        """The inbox row of a command, or of a prompt given to `/mm`."""
        assert where.thread_ts is not None
        return await asyncio.to_thread(
            record_message,
            self.engine,
            channel_id=where.channel,
            thread_ts=where.thread_ts,
            message_ts=where.message_ts,
            user_id=where.user,
            text=text,
            team_id=where.team,
            slack_team_id=where.slack_team,
            enterprise_id=where.enterprise,
            assistant_thread=where.assistant_thread,
            command=command,
            # A prompt's files are downloaded with it (workers.uploads); a command's turn takes no files.
            files=where.files if command is None else None,
        )

    async def _repo_refusal(self, command: Command, channel: str, place: Team = NOWHERE) -> str | None:
        if not command.args:
            return REPO_USAGE
        url, *rest = command.args
        allowed = self._view(place).channel(channel).repos
        try:
            await asyncio.to_thread(check_repo, url, rest[0] if rest else None, allowed, channel=channel)
        except RepoRefused as e:
            return REPO_REFUSED.format(reason=e)
        return None

    def _repo(self, command: Command, where: Where, session: str | None) -> Outcome:
        assert where.thread_ts is not None
        if not command.args:
            return Outcome(private=REPO_USAGE)
        if session is not None and (log_length(self.engine, session) or has_messages(self.engine, session)):
            return Outcome(private=REPO_LATE)
        allowed = self._view(_place(where)).channel(where.channel).repos
        try:
            url, *rest = command.args
            choice = check_repo(url, rest[0] if rest else None, allowed, channel=where.channel)
        except RepoRefused as e:
            return Outcome(private=REPO_REFUSED.format(reason=e))
        set_repo(self.engine, self._ensure(where), choice.url, choice.branch)
        branch = f" (branch `{choice.branch}`)" if choice.branch else ""
        return Outcome(public=REPO_SET.format(url=public_url(choice.url), branch=branch))

    async def _options(self, command: Command, where: Where, session: str | None) -> Outcome:
        """A request that starts with `repo=`, `branch=`, `model=`: each checked (the repository by the channel's
        policy, chatops.repos; the model against `models`), then set on the thread and the prompt recorded. A
        refusal is said in the thread and nothing runs: a turn on another repository or model than the person
        asked for would do the wrong work."""
        # Carried out before, up to keeping its prompt (a replay after the bot died): the same again, but the thread
        # it started is not "too late" for its own repository.
        replay = session is not None and await asyncio.to_thread(has_message, self.engine, session, where.message_ts)
        options, prompt = _options_of(command)
        if isinstance(options, str):
            return Outcome(public=options)
        model = options.get("model")
        if model is not None and (refusal := self._model_refusal(model)):
            return Outcome(public=refusal)
        said: list[str] = []
        if "repo" in options or "branch" in options:
            refusal, url, branch = await asyncio.to_thread(
                self._repo_option, options, where, None if replay else session
            )
            if refusal is not None:
                return Outcome(public=refusal)
            await asyncio.to_thread(set_repo, self.engine, await asyncio.to_thread(self._ensure, where), url, branch)
            said.append(REPO_SET.format(url=public_url(url), branch=f" (branch `{branch}`)" if branch else ""))
        if model is not None:
            ensure = await asyncio.to_thread(self._ensure, where)
            await asyncio.to_thread(set_model, self.engine, ensure, model)
            said.append(MODEL_SET.format(name=model))
        enqueue = None
        if prompt.strip():
            recorded = await self._keep(where, prompt)
            enqueue = recorded.session_id  # again on a replay: the hand-off may be what was lost
        return Outcome(public="\n".join(said) or None, enqueue=enqueue)

    def _model_refusal(self, model: str) -> str | None:
        service = self.config.service
        if model in service.models:
            return None
        return UNKNOWN_MODEL.format(name=model[:100], models=service.model_names())

    async def _options_refusal(self, command: Command, channel: str, place: Team = NOWHERE) -> str | None:
        """`/mm OPTIONS PROMPT`: what refuses the options before a thread is started for them."""
        options, _prompt = _options_of(command)
        if isinstance(options, str):
            return options
        if "model" in options and (refusal := self._model_refusal(options["model"])):
            return refusal
        if "repo" in options or "branch" in options:
            where = Where(channel, None, "", "", slack_team=place.team_id, enterprise=place.enterprise_id)
            refusal, _url, _branch = await asyncio.to_thread(self._repo_option, options, where, None)
            return refusal
        return None

    def _repo_option(
        self, options: dict[str, str], where: Where, session: str | None
    ) -> tuple[str | None, str, str | None]:
        """Why `repo=`/`branch=` cannot be taken, or None and the repository and branch to set."""
        if session is not None and (log_length(self.engine, session) or has_messages(self.engine, session)):
            return REPO_LATE + " Nothing was run.", "", None
        channel = self._view(_place(where)).channel(where.channel)
        try:
            if "repo" in options:
                choice = check_repo(options["repo"], options.get("branch"), channel.repos, channel=where.channel)
                return None, choice.url, choice.branch
            if not channel.repo:
                return BRANCH_WITHOUT_REPO, "", None
            check_branch(options["branch"])
            return None, channel.repo, options["branch"]
        except RepoRefused as e:
            return OPTION_REFUSED.format(reason=e), "", None

    def _ensure(self, where: Where) -> str:
        """The session of the request's thread (made when it has none yet), as its requester's."""
        return ensure_session(
            self.engine,
            channel_id=where.channel,
            thread_ts=where.thread_ts,
            team_id=where.team,
            requester=where.user,
            assistant_thread=where.assistant_thread,
            slack_team_id=where.slack_team,
            enterprise_id=where.enterprise,
        )

    def _view(self, place: Team) -> ServiceConfig:
        """The config as the workspace `place` sees it (its `teams` section over the top level's)."""
        return self.config.service.for_team(place.team_id, place.enterprise_id)

    def status(self, session_id: str) -> str:
        summary = session_summary(self.engine, session_id)
        if summary is None:
            return NO_SESSION
        prompt, completion = tokens_used(self.engine, session_id)
        waiting = pending_approvals(self.engine, session_id=session_id)
        state = {
            SessionStatus.IDLE: "idle",
            SessionStatus.QUEUED: "queued for a worker",
            SessionStatus.RUNNING: "running a turn",
            SessionStatus.AWAITING_APPROVAL: "waiting for a decision",
        }.get(SessionStatus(summary.status), summary.status)
        channel = self._view(session_team(self.engine, session_id)).channel(summary.channel_id or "")
        repo = summary.repo or channel.repo
        branch = summary.branch or channel.branch
        lines = [
            Mrkdwn("*Status:* {state}").format(state=state),
            Mrkdwn("*Repository:* {repo}").format(repo=public_url(repo) if repo else "none (an empty workspace)")
            + (Mrkdwn(" (branch `{branch}`)").format(branch=branch) if branch else ""),
            Mrkdwn("*Model:* {model}").format(model=self._model(session_id, channel.model)),
            Mrkdwn("*Asks before commands and edits:* {asks}").format(asks=self._asks(session_id)),
            Mrkdwn("*Tokens:* {all:,} ({prompt:,} prompt, {completion:,} completion)").format(
                all=prompt + completion, prompt=prompt, completion=completion
            ),
        ]
        lines.append(Mrkdwn("*Instructions:* {used}").format(used=self._instructions(session_id)))
        lines.append(Mrkdwn("*Network:* {network}").format(network=self._network(session_id)))
        if waiting:
            titles = Mrkdwn(", ").join(mrkdwn_of(line_of(p.row), self.secrets()) for p in waiting)
            lines.append(Mrkdwn("*Waiting for a decision:* {titles}").format(titles=titles[:1000]))
        if (pull := pull_requests.of_session(self.engine, session_id)) is not None:
            # As last recorded: `pr` asks the forge for its review and checks.
            shown = Mrkdwn("<{url}|{label}>").format(url=pull.url, label=pull.label) if pull.url else pull.label
            lines.append(
                Mrkdwn("*Pull request:* {pull} ({state}; `pr` shows its checks)").format(pull=shown, state=pull.state)
            )
        return Mrkdwn("\n").join(lines)

    def _model(self, session_id: str, channel_model: str | None) -> str:
        """The `models` entry the thread runs with (its own `model=`, else the channel's), or the agent's model."""
        name = thread_model(self.engine, session_id) or channel_model
        if name is None:
            return f"{self.config.agent.model.name} (the config's `model`)"
        found = self.config.service.models.get(name)
        return f"{name} ({found.name})" if found else f"{name} (no longer configured: its turns are refused)"

    def _instructions(self, session_id: str) -> str:
        """What the latest turn's system prompt added (workers.turns records it): the channel's instructions, yes
        or no and their size, and the repository's files read, or looked for and not read."""
        used = instructions_used(self.engine, session_id)
        if used is None:
            return "none yet (the first turn reads them)"
        channel = used.get("channel")
        parts = [f"the channel's: yes ({channel:,} characters)" if channel else "the channel's: no"]
        read = [f"{f['path']} ({f['size']:,} bytes{', cut' if f.get('cut') else ''})" for f in used.get("files", [])]
        skipped = [f"{f['path']} not read ({f['why']})" for f in used.get("skipped", [])]
        parts.append("the repository's: " + (", ".join(read + skipped) or "none found"))
        return "; ".join(parts)

    def _network(self, session_id: str) -> str:
        """The egress policy the thread's commands run under (workers.egress decides it), and the hosts its latest
        turn with network traffic reached and was refused (the worker records them)."""
        if self.config.agent.sandbox == "none":
            return "the worker's own (`sandbox: none`: commands are not confined, whatever `network` says)"
        network = thread_network(self.engine, self.config, session_id)
        if network is None or network.policy == "off":
            return "off (commands have no network)"
        if network.policy == "open":
            said = "open (the internet, never the worker's networks; hosts are not recorded)"
        else:
            credentialed = sorted({h for c in network.credentials for h in c.hosts})
            said = "allow-list: " + ", ".join(network.allow) if network.allow else "allow-list: empty"
            said += f" (credentials added for {', '.join(credentialed)})" if credentialed else ""
        used = network_used(self.engine, session_id)
        if used is None:
            return said
        shown = NETWORK_STATUS_HOSTS
        reached = [f"{host} ({count})" for host, count in sorted(used.get("reached", {}).items())]
        refused = sorted(used.get("refused", {}))
        parts = [said]
        if reached:
            parts.append("last reached " + ", ".join(reached[:shown]) + (" …" if len(reached) > shown else ""))
        if refused:
            parts.append("refused " + ", ".join(refused[:shown]) + (" …" if len(refused) > shown else ""))
        return "; ".join(parts)

    def _asks(self, session_id: str) -> Mrkdwn:
        """Whether the thread asks before gated calls, and for whom: the worker's own answer (workers.asking),
        from the thread's, a running job's, the channel's and the config's yolo and from the conversation (`yolo
        on|off` said in it, the requesters an approver's "Approve all" covers)."""
        found = thread_asking(self.engine, self.config, session_id)
        if found is None:
            return Mrkdwn("yes")
        answer, setting = found
        if answer.everyone:
            return Mrkdwn("no (yolo)")
        if not answer.granted:
            return Mrkdwn("yes")
        people = sorted(p for p in answer.granted if p)
        who = [mention(p) for p in people] + ([JOB_PROMPT] if None in answer.granted else [])
        why = "an approver approved all their calls" if set(answer.granted) - setting.standing else "the job's yolo"
        return Mrkdwn("yes, but not for {who} ({why})").format(who=Mrkdwn(", ").join(who), why=why)

    # -- /mm ----------------------------------------------------------------------------------------------------

    async def slash(
        self,
        slack: SlackOut,
        text: str,
        channel: str,
        user: str,
        team: str | None,
        trigger: str,
        steps: Steps,
        place: Team | None = None,
    ) -> Outcome:
        """`/mm …` in a channel: a command for the person's latest session there, the jobs' commands, or a prompt
        for a new thread. `steps`: what an earlier attempt at this invocation did; `place`: the workspace the
        installation answers it from."""
        place = place or NOWHERE
        if self.jobs is not None and is_job_command(text):
            private, public = await self.jobs.answer(slack.client, text, user, steps, place)
            if public is not None:
                await announce(slack, steps, public[0], None, public[1])
            return Outcome(private=private)
        if self.admin is not None and is_admin_command(text):
            return Outcome(private=await self.admin.answer(slack, text, user, steps, place))
        command = parse(text)
        if not text.strip() or (command is not None and command.name == "help"):
            return Outcome(private=HELP.format(agents=self.agents(), models=self.config.service.model_names()))
        if command is not None and command.name == "new":
            return Outcome(private=SLASH_NEW)
        if command is not None and command.name == "ask" and (refusal := self._ask_refusal(command)):
            return Outcome(private=refusal)
        if (
            command is not None
            and command.name == "repo"
            and (refusal := await self._repo_refusal(command, channel, place))
        ):
            return Outcome(private=refusal)  # before a thread is started for it
        if (
            command is not None
            and command.name == "options"
            and (refusal := await self._options_refusal(command, channel, place))
        ):
            return Outcome(private=refusal)  # before a thread is started for it
        if command is None or command.name in ("ask", "repo", "options"):
            return await self._new_thread(slack, command, text.strip(), channel, user, team, steps, place)
        latest = await asyncio.to_thread(latest_session, self.engine, channel, user)
        if latest is None or latest.thread_ts is None:
            return Outcome(private=NO_SESSION)
        # The command's inbox row needs an id of its own: the invocation's trigger id is one.
        said = "slash:" + hashlib.sha1(trigger.encode()).hexdigest()[:24]
        where = Where(
            channel, latest.thread_ts, said, user, team, slack_team=place.team_id, enterprise=place.enterprise_id
        )
        outcome = await self.run(slack, command, where, steps)
        if outcome.public:  # said in the session's thread, not at the top of the channel the command was typed in
            await announce(slack, steps, channel, latest.thread_ts, outcome.public)
        return Outcome(private=outcome.private, enqueue=outcome.enqueue)

    async def _new_thread(
        self,
        slack: SlackOut,
        command: Command | None,
        text: str,
        channel: str,
        user: str,
        team: str | None,
        steps: Steps,
        place: Team,
    ) -> Outcome:
        """A new thread for a prompt, an `ask`, or a `repo` (then the person continues in the thread). Its root
        is posted once (bot.steps: an attempt after a crash finds it and goes on in that thread; the rest is
        idempotent: the inbox row is unique)."""
        if command is not None and command.name == "repo":
            head = STARTED_FOR_REPO.format(user=user)
        else:
            head = STARTED.format(user=user, prompt=text[:2800])
        thread_ts = await steps.post(slack, ROOT, channel, head)
        where = Where(
            channel, thread_ts, thread_ts, user, team, slack_team=place.team_id, enterprise=place.enterprise_id
        )
        if command is not None:
            outcome = await self.run(slack, command, where, steps)
        else:
            recorded = await self._keep(where, text)
            outcome = Outcome(enqueue=recorded.session_id)
        if outcome.public or outcome.private:
            await steps.post(slack, SAID, channel, outcome.public or outcome.private or "", thread_ts)
        return Outcome(enqueue=outcome.enqueue)


def _place(where: Where) -> Team:
    """The workspace a command came from."""
    return Team(where.slack_team, where.enterprise)


async def announce(slack: SlackOut, steps: Steps, channel: str, thread_ts: str | None, text: str) -> None:
    """A command's line for everyone, in the thread (None: the channel) it is about, once (bot.steps)."""
    async with courtesy(f"announce a change in {channel}/{thread_ts}"):
        await steps.post(slack, ANNOUNCED, channel, text, thread_ts)
