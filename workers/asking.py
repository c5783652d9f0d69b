"""Whether a thread asks before its gated calls, and for whom: decided here, once, for the worker that runs the
thread's turns (workers/turns.py) and for `status`, which says it (bot/commands.py).

For everyone: the thread's own switch (`yolo on|off`, kept in sessions.yolo) over a running job's yolo, over the
channel's, over the agent config's. A job's `yolo: true` covers only its prompt, which nobody wrote (a standing
grant to the requester None): a person's request in a run's thread follows the channel, whenever it is taken. Then
the conversation decides (mm_core.state.asking): `yolo on|off` said in its log, and the requesters an approver's
"Approve all" granted.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, select

from chatops.config import Config, JobConfig, ServiceConfig
from chatops.schema import Session
from chatops.store import log_of
from mm_core.config import AgentConfig
from mm_core.state import Asking, SessionState, asking
from workers.jobs import job_of_session
from workers.push import agent_of

NOBODY = frozenset[str | None]()
JOB_PROMPT = frozenset[str | None]({None})  # the requesters of a job's prompt: nobody wrote it


@dataclass(frozen=True)
class ThreadSetting:
    """What the front end gives the loop: whether calls run without asking for everyone (unless the conversation
    says `yolo on|off`), and whose calls run without asking besides those an approver granted (Agent.granted)."""

    default: bool
    standing: frozenset[str | None] = NOBODY


def thread_setting(
    service: ServiceConfig, agent: AgentConfig, channel: str, thread_yolo: bool | None, job: JobConfig | None
) -> ThreadSetting:
    """The thread's setting: `service` the config as its workspace sees it (ServiceConfig.for_team), `agent` the
    agent config its turns run with (a job's own), `thread_yolo` the thread's switch, `job` the job whose run the
    thread is while the run runs."""
    if thread_yolo is not None:
        return ThreadSetting(thread_yolo)
    channel_yolo = service.channel(channel).yolo
    default = agent.yolo if channel_yolo is None else channel_yolo
    if job is None or job.yolo is None:
        return ThreadSetting(default)
    # The run's prompt alone runs with the job's yolo; `yolo: false` asks for everything of the run.
    return ThreadSetting(default, JOB_PROMPT) if job.yolo else ThreadSetting(False)


def thread_asking(engine: Engine, config: Config, session_id: str) -> tuple[Asking, ThreadSetting] | None:
    """The session's answer as its next turn would take it (None: no such session), and the setting it came from."""
    with engine.connect() as conn:
        row = conn.execute(
            select(
                Session.channel_id, Session.yolo, Session.agent_name, Session.slack_team_id, Session.enterprise_id
            ).where(Session.id == session_id)
        ).first()
    if row is None:
        return None
    running = job_of_session(engine, config, session_id)
    agent = agent_of(config, row.agent_name)
    service = config.service.for_team(row.slack_team_id, row.enterprise_id)
    setting = thread_setting(service, agent, row.channel_id or "", row.yolo, running.job if running else None)
    state = SessionState.of(log_of(engine, session_id))
    return asking(state, setting.default, setting.standing), setting
