"""`mm-bot doctor`: check what the bot needs, one line per check, each failure with how to fix it.

    ok   config    mm.yaml
    ok   database  sqlite:///./var/mm.sqlite3 (at head 0001)
    FAIL model     http://localhost:12434/engines/v1 unreachable: connection refused — start your model ...

Secrets are never printed: URLs have their passwords masked, and every line is scrubbed of the secret values
the process knows (tokens, API key, URL passwords) in case an error message echoes one.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from chatops.config import SLACK_DOCS, Config, ConfigError, load_config
from chatops.secrets import describe_error, mask_url, scrub, secrets_of
from mm_core.tools.fetch.http import parse_url
from mm_core.tools.sandbox_network import network_report

if TYPE_CHECKING:
    from mm_core.config import AgentConfig

TIMEOUT = 5.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        """The check's line; a detail of several lines (config problems) continues under the first."""
        first, *rest = self.detail.splitlines() or [""]
        return "\n".join([f"{'ok' if self.ok else 'FAIL':<5}{self.name:<10}{first}", *(" " * 15 + r for r in rest)])


# --- the checks ---------------------------------------------------------------------------------------------


def check_database(config: Config) -> Check:
    from chatops import db

    url = mask_url(config.database_url)
    try:
        current = db.current_revision(config.database_url)
    except Exception as exc:  # noqa: BLE001 - any driver error: the sentence says what to do
        why = getattr(exc, "reason", None) or describe_error(exc)  # db.DatabaseUnavailable has said it already
        return Check("database", False, f"{url} unreachable: {why} — start the database or set DATABASE_URL")
    head = db.head_revision()
    if current == head:
        return Check("database", True, f"{url} (at head {head})")
    if current is None:
        return Check("database", False, f"{url} has no schema yet (head is {head}) — run `mm-bot migrate`")
    return Check("database", False, f"{url} is at {current}, head is {head} — run `mm-bot migrate`")


def check_broker(config: Config) -> Check:
    url = mask_url(config.broker_url)
    reachable, reason = broker_reachable(config.broker_url)
    if reachable:
        return Check("broker", True, url)
    return Check("broker", False, f"{url} unreachable: {reason} — start Redis or set CELERY_BROKER_URL")


def broker_reachable(url: str, timeout: float = 3.0) -> tuple[bool, str]:
    """Whether kombu can connect to the broker at `url` (one attempt), and why not."""
    from kombu.connection import Connection

    try:
        # kombu annotates connect_timeout as an int; its transports take fractions of seconds too.
        with Connection(url, connect_timeout=timeout, transport_options={"max_retries": 0}) as conn:  # pyright: ignore[reportArgumentType]
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout)
        return True, ""
    except Exception as exc:  # noqa: BLE001 - kombu raises the transport's own errors
        return False, describe_error(exc)


def check_model(config: Config) -> Check:
    model = config.agent.model
    base = model.url.rstrip("/")
    url = mask_url(base)
    key_env = model.apiKeyEnv
    headers = {"Authorization": f"Bearer {config.model_api_key}"} if config.model_api_key else {}
    try:
        # A port out of range: the workers' client refuses it, and httpx would ask the port it wraps to (99999 is
        # 34463), where anything may answer.
        parse_url(f"{base}/models")
        response = httpx.get(f"{base}/models", headers=headers, timeout=TIMEOUT)
    except httpx.TimeoutException:
        return Check("model", False, f"{url} did not answer within {TIMEOUT:g}s — is the model server up?")
    except (ValueError, httpx.InvalidURL) as exc:  # not an HTTPError: a URL httpx cannot even parse
        return Check(
            "model", False, f"{url} is not a usable URL: {describe_error(exc)} — set MM_MODEL_URL or model.url"
        )
    except httpx.HTTPError as exc:
        return Check(
            "model", False, f"{url} unreachable: {describe_error(exc)} — start your model server or set MM_MODEL_URL"
        )
    if response.status_code in (401, 403):
        fix = f"check the key in {key_env}" if key_env else "set model.apiKeyEnv in mm.yaml and export that variable"
        return Check("model", False, f"{url} rejected the API key (HTTP {response.status_code}) — {fix}")
    not_openai = "is MM_MODEL_URL the OpenAI-compatible base URL (usually ending in /v1)?"
    if response.status_code != 200:
        return Check("model", False, f"{url} answered HTTP {response.status_code} to GET /models — {not_openai}")
    try:
        names = [entry["id"] for entry in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        return Check("model", False, f"{url} answered GET /models with no model list — {not_openai}")
    if model.name not in names:
        have = ", ".join(names[:10]) + (", …" if len(names) > 10 else "") if names else "none"
        return Check(
            "model", False, f'{url} does not serve model "{model.name}" (it has: {have}) — set model.name or MM_MODEL'
        )
    return Check("model", True, f"{url} serves {model.name}")


def check_slack(config: Config) -> Check:
    """Slack's answer to the bot token and every secret that is not set, in one line: fixing them one run of
    doctor at a time is what this saves."""
    unset = unset_secrets(config)
    if config.oauth:
        ok, answer = slack_installations(config)
        return Check("slack", ok and not unset, "; ".join(part for part in (answer, unset) if part))
    if not config.slack_bot_token:
        return Check("slack", False, unset)
    ok, answer = slack_auth(config)
    return Check("slack", ok and not unset, "; ".join(part for part in (answer, unset) if part))


def slack_auth(config: Config) -> tuple[bool, str]:
    """Whether Slack accepts the bot token (auth.test), and what it said."""
    from slack_sdk import WebClient
    from slack_sdk.errors import SlackApiError

    from slackio.slack_client import api_base

    api = mask_url(config.slack_api_url)
    client = WebClient(token=config.slack_bot_token, base_url=api_base(config.slack_api_url), timeout=int(TIMEOUT))
    try:
        auth = client.auth_test()
    except SlackApiError as exc:
        error = exc.response.get("error", "error") if exc.response is not None else "error"
        return False, f"{api} rejected SLACK_BOT_TOKEN ({error}) — copy the Bot User OAuth Token again ({SLACK_DOCS})"
    except Exception as exc:  # noqa: BLE001 - urllib's connection errors, whatever their class
        return False, f"{api} unreachable: {describe_error(exc)} — check SLACK_API_URL and the network"
    return True, f"{api} @{auth.get('user')} in {auth.get('team')}"


def slack_installations(config: Config) -> tuple[bool, str]:
    """Installed through OAuth: the workspaces and orgs the app is installed in (from the database), and the
    config's `teams` sections that none of them answers."""
    import asyncio

    from slackio.installations import installations

    try:
        found = asyncio.run(installations(config).every())
    except Exception as exc:  # noqa: BLE001 - whatever the database says, in one line
        return False, f"the app's installations could not be read: {describe_error(exc)}"
    if not config.service.teams:
        return (
            False,
            "the config serves no Slack workspace yet — add a teams.<team id> section for each (docs/slack-app.md)",
        )
    if not found:
        return False, "installed in no workspace yet — open /slack/install on the bot to install it"
    named = [
        f"{i.team_name or i.enterprise_name or '?'} ({i.team_id or f'org {i.enterprise_id}'}"
        f"{', token rotates' if i.bot_refresh_token else ''}, since {_day(i.installed_at)})"
        for i in found
    ]
    said = f"installed in {len(found)}: {', '.join(named)}"
    known = {i.team_id for i in found} | {i.enterprise_id for i in found if i.is_enterprise_install}
    if lost := [key for key in config.service.teams if key not in known]:
        said += f"; no installation answers teams.{', teams.'.join(lost)} (install the app there)"
    if orphans := [job.name for job in config.service.jobs if job.team is None]:
        # Under OAuth a job needs a workspace to run and report in: each run would fail as not installed.
        return False, said + f"; jobs in no workspace (move them under teams.<id>.jobs): {', '.join(orphans)}"
    return True, said


def _day(stamp: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(stamp))


def unset_secrets(config: Config) -> str:
    """The secrets the environment lacks, all of them, with where each comes from; "" when none is missing."""
    missing = missing_secrets(config)
    if not missing:
        return ""
    key_env = config.agent.model.apiKeyEnv
    where = [f"the Slack app's secrets: see {SLACK_DOCS}"] if any(name != key_env for name in missing) else []
    if key_env in missing:
        where.append(f"{key_env}: the model endpoint's API key, named by model.apiKeyEnv")
    one = len(missing) == 1
    return f"{_names(missing)} {'is' if one else 'are'} not set — export {'it' if one else 'them'} ({'; '.join(where)})"


def missing_secrets(config: Config) -> list[str]:
    """Every secret the service needs and the environment lacks: Slack's (Socket Mode's when SLACK_APP_TOKEN
    is set), then the model's key when model.apiKeyEnv names one."""
    missing = config.missing_slack_secrets(socket_mode=bool(config.slack_app_token))
    key_env = config.agent.model.apiKeyEnv
    if key_env and not config.model_api_key:
        missing.append(key_env)
    return missing


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def check_sandbox(config: Config) -> Check:
    """What a worker would do with this machine and `sandbox`: confine commands, refuse to start, or warn."""
    from workers.celery_app import UNSANDBOXED, sandbox_problem

    if config.agent.sandbox == "none":
        return Check("sandbox", True, f"warning: {UNSANDBOXED}")
    problem = sandbox_problem(config.agent)
    if problem is not None:
        return Check("sandbox", False, f"a worker refuses to start: {problem}")
    return Check("sandbox", True, f"bubblewrap at {shutil.which('bwrap')}")


def sandbox_note(agent: AgentConfig) -> str | None:
    """What `mm-bot run` and `mm-bot dev` say once, where a worker would refuse to start: a laptop may lack
    bubblewrap, and its owner should know what that means for the commands the agent runs."""
    from workers.celery_app import INSTALL_BWRAP, sandbox_problem

    if sandbox_problem(agent) is None:
        return None
    if agent.sandbox == "bwrap":
        return (
            f"bubblewrap is not installed, and `sandbox: bwrap` requires it: every bash command will be refused; "
            f"{INSTALL_BWRAP}, or set `sandbox: none`"
        )
    if os.geteuid() == 0:
        return (
            f"bubblewrap is not installed, and you are root: bash commands and language servers are refused in "
            f"directories root owns (they would run as root); {INSTALL_BWRAP}, or run as an unprivileged user"
        )
    return (
        f"bubblewrap is not installed: bash commands run unsandboxed, with your access to files and the network; "
        f"{INSTALL_BWRAP} to confine each to its workspace, or set `sandbox: none` to say you mean it"
    )


def check_network(config: Config) -> Check:
    """Where the agent's commands and fetches may connect (docs/network.md): the top-level policy, how many channels
    and jobs have their own, and what this machine lacks for any of them (`open` without slirp4netns or nft; a
    credential whose variable is not set here, a warning: the bot's machines have none)."""
    network = config.agent.egress
    said = {
        "off": "off: commands have no network, fetch_content reaches nothing",
        "allow": "allow: " + (", ".join(network.allow) or "no host"),
        "open": "open: the internet, never the worker's own or internal addresses",
    }[network.policy]
    own = sum(c.network is not None for c in config.service.channels.values())
    own += sum(j.network is not None for j in config.service.jobs)
    if own:
        said += f" ({own} channel{'s' if own > 1 else ''} or job{'s' if own > 1 else ''} with their own)"
    policies = config.service.network_policies(config.agent)
    opened = [n for n in policies if n.policy == "open"]
    if opened and config.agent.sandbox != "none" and (report := network_report(config.agent.with_network(opened[0]))):
        return Check("network", False, report)
    unset = sorted({c.tokenEnv for n in policies for c in n.credentials if not os.environ.get(c.tokenEnv)})
    if unset:
        said += f"; warning: {_names(unset)} unset here: a worker without it refuses the hosts it is the credential for"
    return Check("network", True, said)


CHECKS = (check_database, check_broker, check_model, check_slack, check_sandbox, check_network)


def run_checks(config_path: str | None = None) -> Iterator[Check]:
    """The checks in order, each as soon as it is done (a bad config stops the rest: they need it)."""
    try:
        config = _load_past_an_unset_key(config_path)
    except ConfigError as exc:
        yield Check("config", False, f"{exc} — fix the file (`mm-bot init --path new.yaml` writes an example)")
        return
    yield Check("config", True, str(config.path) if config.path else "no mm.yaml: embedded defaults")
    secrets = secrets_of(config)
    for check in CHECKS:
        result = check(config)
        yield Check(result.name, result.ok, scrub(result.detail, secrets))


# The config module's words when model.apiKeyEnv names a variable that is not set (docs/configuration.md).
UNSET_KEY = re.compile(r"model\.apiKeyEnv: the environment variable (\S+) is not set$")


def _load_past_an_unset_key(config_path: str | None) -> Config:
    """The config, even when the model key's variable is unset: every other command stops there, while doctor
    goes on, so that the slack line names that secret together with the others, and the other checks run."""
    try:
        return load_config(config_path)
    except ConfigError as exc:
        names = [match[1] for problem in exc.problems if (match := UNSET_KEY.search(problem))]
        if len(names) != len(exc.problems):
            raise
    placeholder = dict.fromkeys(names, "unset")
    return dataclasses.replace(load_config(config_path, environ={**os.environ, **placeholder}), model_api_key=None)


def main(config_path: str | None = None) -> int:
    """Print one line per check; 0 when all are ok, 1 otherwise."""
    failed = False
    for check in run_checks(config_path):
        print(check.line(), flush=True)
        failed |= not check.ok
    return 1 if failed else 0
