"""`mm-bot dev`: everything one machine needs, in one command, on the embedded defaults.

It migrates the database, picks a broker, starts the bot and a worker (commands/services.py), prints where the
bot listens and what is still missing, and stops them all on Ctrl-C. Without a Slack token there is nothing for
the bot to talk to, so it starts the playground instead (commands/playground.py): the bot in a browser.
"""

from __future__ import annotations

import os

from bot.server import check_port
from chatops.config import SLACK_DOCS, load_config
from chatops.secrets import mask_url, scrub, secrets_of
from commands.doctor import check_model
from commands.playground import run_playground
from commands.services import Child, prepare, run_services

NO_SIGNING_SECRET = (
    "no SLACK_SIGNING_SECRET: Slack's requests are refused (they cannot be verified) until you set it; "
    f"see {SLACK_DOCS}"
)
# What `make run` says when there is no Slack token, with the one line that switches to real Slack.
PLAYGROUND_INSTEAD = (
    "no SLACK_BOT_TOKEN: starting the playground, the bot in a Slack-like page of your browser; for real Slack: "
    f"SLACK_BOT_TOKEN=xoxb-… SLACK_SIGNING_SECRET=… make run (see {SLACK_DOCS})"
)


def say(message: str) -> None:
    print(f"mm-bot dev: {message}", flush=True)


def run_dev(config_path: str | None, host: str, port: int) -> int:
    """Raises CannotListen, before anything starts, when host:port is taken."""
    check_port(host, port)
    config = load_config(config_path)
    if not config.slack_bot_token and not config.oauth:
        # Nothing to talk to: show the product in the browser instead of a bot waiting for a token.
        say(PLAYGROUND_INSTEAD)
        return run_playground(config_path, host, port, speaker=say)
    broker = prepare(config, os.environ, say)
    env = dict(os.environ, CELERY_BROKER_URL=broker)

    def ready(children: list[Child]) -> None:
        base = f"http://{host}:{port}"
        say(f"bot listening on {base}: Slack's requests to {base}/slack/events, health at {base}/healthz")
        say(f"worker started (pid {children[1].process.pid}) on {mask_url(broker)}")
        jobs = len(config.service.jobs)
        say(f"scheduler: housekeeping and the config's {jobs} job(s) run in the worker")
        if not config.slack_signing_secret:
            say(NO_SIGNING_SECRET)
        model = check_model(config)
        if not model.ok:
            say(f"model: {scrub(model.detail, secrets_of(config))}")
        say("ready; Ctrl-C stops everything")

    return run_services(config_path, env, host, port, ready, say)
