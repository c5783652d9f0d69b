"""What a turn's commands did on the network (mm_core.events.NetworkUsed, from the egress proxy): one line in the
worker's log for each host a turn reached or was refused, and the turn's hosts kept for `status`.

Which egress policy a thread runs under is decided once, here (`thread_network`), for the worker's turns and
the bot's `status` alike.
"""

from __future__ import annotations

import logging

from sqlalchemy import Engine, select

from chatops.config import Config, JobConfig, ServiceConfig
from chatops.schema import Session
from chatops.store import set_network_used
from mm_core.config import AgentConfig, NetworkConfig
from mm_core.events import NetworkUsed
from workers.jobs import job_of_session
from workers.push import agent_of

log = logging.getLogger(__name__)

# The most hosts of each kind kept for `status`: a command trying thousands of names must not grow the row.
MAX_HOSTS = 50


class TurnNetwork:
    """The hosts one turn's commands reached (with their connections) and were refused (with why)."""

    def __init__(self) -> None:
        self.reached: dict[str, int] = {}
        self.refused: dict[str, str] = {}

    def saw(self, event: NetworkUsed) -> None:
        for host, count in event.reached:
            if host not in self.reached:
                if len(self.reached) >= MAX_HOSTS:
                    continue
                log.info("network: reached %s", host)
            self.reached[host] = self.reached.get(host, 0) + count
        for host, why in event.refused:
            if host not in self.refused and len(self.refused) < MAX_HOSTS:
                log.info("network: refused %s: %s", host, why)
                self.refused[host] = why

    def record(self, engine: Engine, session_id: str) -> None:
        """Keep what the turn saw for `status` (nothing when it used no network: the last turn that did stays)."""
        if self.reached or self.refused:
            set_network_used(engine, session_id, {"reached": self.reached, "refused": self.refused})


def with_thread_network(
    service: ServiceConfig, agent: AgentConfig, channel_id: str, job: JobConfig | None, own_agent: bool = False
) -> AgentConfig:
    """`agent` under the thread's own policy: its running job's `network`, else its channel's (as the thread's
    workspace configures it: `service` is ServiceConfig.for_team's view), else its own. A job's own agent
    (`own_agent`: an `mmConfigs` file) that says `network: off` keeps it, as an asked agent does."""
    if own_agent and agent.egress.policy == "off":
        return agent
    return agent.with_network(service.network_over(channel_id, job))


def thread_network(engine: Engine, config: Config, session_id: str) -> NetworkConfig | None:
    """The policy the session's next turn runs under (None: no such session)."""
    with engine.connect() as conn:
        columns = (Session.channel_id, Session.agent_name, Session.slack_team_id, Session.enterprise_id)
        row = conn.execute(select(*columns).where(Session.id == session_id)).first()
    if row is None:
        return None
    running = job_of_session(engine, config, session_id)
    agent = agent_of(config, row.agent_name)
    job = running.job if running else None
    own = bool(row.agent_name) and row.agent_name in config.agent.mmConfigs
    service = config.service.for_team(row.slack_team_id, row.enterprise_id)
    return with_thread_network(service, agent, row.channel_id or "", job, own).egress
