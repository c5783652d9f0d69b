"""`mm-bot playground`: the whole bot in a browser, with no Slack workspace (what `make run` starts without a token).

It runs what `mm-bot dev` runs (migrations, the bot, a worker) with three parts of its own in this process: the
Slack Web API emulator the bot and the worker talk to (playground/slack_api.py), the page that shows the
emulator's channel and turns clicks into signed requests to the bot (playground/server.py), and, when no model
answers, the demo model that plays a scripted session (playground/demo_model.py).

The config is the person's own, with an overlay (var/playground/overlay.yaml, shown on the page) that adds the
playground's channel: its repository, yolo off so calls ask, and one of the page's people as its approver. The
demo repository lives on a forge emulator (playground/forge_server.py, GitHub's API) in this process too, so a
thread's "Open pull request" opens a real pull request there, listed on the emulator's page.

With `--workspaces 2` the app is the one distributed to many workspaces (docs/slack-app.md, "Many workspaces"):
two workspaces in the emulator, Acme and Globex, each with its channel and its people; the bot and the worker run
with the app's OAuth client and no bot token, and once the bot answers the playground installs the app in each
through the real flow, as a person's browser would (the bot's /slack/install, Slack's authorize page, the bot's
/slack/oauth_redirect with bolt's state cookie), so every token they use is one bolt saved. The overlay adds both
channels, and the page switches between the workspaces.
"""

from __future__ import annotations

import contextlib
import fcntl
import html
import os
import re
import secrets
import shutil
import socket
import ssl
import sys
import webbrowser
from collections.abc import Callable, Iterator
from pathlib import Path

import certifi
import httpx
import yaml

from bot.oauth import INSTALL_PATH, REDIRECT_PATH
from bot.server import check_port
from chatops.config import Config, load_config
from chatops.secrets import mask_url
from commands.doctor import check_model
from commands.errors import CommandError
from commands.services import Child, prepare, run_services
from playground.demo_model import DEMO_CONTENT, DEMO_FILE, DEMO_MODEL_NAME, start_demo_model
from playground.forge_server import ForgeServer
from playground.server import ModelInfo, Person, PlaygroundPage, Workspace, is_loopback
from playground.slack_api import SlackEmulator

PLAYGROUND_DIR = Path("var") / "playground"
CHANNEL_ID, CHANNEL_NAME = "C0PLAYGROUND", "playground"
TEAM = "mm playground"
PEOPLE = [
    Person("U0PGADA", "ada", "Ada", "requester", "asks the bot for work"),
    Person("U0PGGRACE", "grace", "Grace", "approver", "may approve tool calls"),
    Person("U0PGLINUS", "linus", "Linus", "member", "may not approve"),
]
PLAYGROUND = Workspace("T0PLAYGROUND", TEAM, CHANNEL_ID, CHANNEL_NAME, tuple(PEOPLE))
# `--workspaces 2`: two workspaces, each with its channel and its people (a Slack account is one workspace's).
WORKSPACES = (
    Workspace("T0ACME", "Acme", "C0ACME", "engineering", tuple(PEOPLE)),
    Workspace(
        "T0GLOBEX",
        "Globex",
        "C0GLOBEX",
        "operations",
        (
            Person("U0GXMARGARET", "margaret", "Margaret", "requester", "asks the bot for work"),
            Person("U0GXBARBARA", "barbara", "Barbara", "approver", "may approve tool calls"),
            Person("U0GXKEN", "ken", "Ken", "member", "may not approve"),
        ),
    ),
)
DEMO_REPO = "playground/demo"  # its path on the forge emulator
# The environment of an app installed through OAuth (docs/slack-app.md, "Many workspaces"): the playground's bot
# answers to the emulator's app alone.
OAUTH_ENV = ("SLACK_CLIENT_ID", "SLACK_CLIENT_SECRET", "SLACK_REDIRECT_URI")
# The worker's variable for the emulator's token: not MM_GITHUB_TOKEN, which may hold the person's token for
# github.com (their jobs' repositories) and must keep doing so.
FORGE_TOKEN_ENV = "MM_PLAYGROUND_FORGE_TOKEN"
START_A_MODEL = (
    "Start one, then set MM_MODEL_URL (and MM_MODEL, the model's name) and run `make run` again:\n"
    "  Ollama: `ollama serve`, `ollama pull gemma3:12b`; MM_MODEL_URL=http://localhost:11434/v1 MM_MODEL=gemma3:12b\n"
    "  llama.cpp: `llama-server -m model.gguf --port 8080`; MM_MODEL_URL=http://localhost:8080/v1\n"
    "  vLLM: `vllm serve <model>`; MM_MODEL_URL=http://localhost:8000/v1 MM_MODEL=<model>\n"
    "  Docker Model Runner: `docker model pull ai/gemma3`; MM_MODEL_URL=http://localhost:12434/engines/v1\n"
    "Until then the demo model plays a scripted session: mention @mm with any request, approve as Grace, and it "
    "runs greet.py, fixes its typo and answers."
)
EXPOSED = (
    "the page has no login: anyone who can reach {address} can post as any of its people, approve the commands "
    "the agent runs on this machine, and read what they print"
)


class Refused(CommandError):
    """The playground will not start as asked: str() says why and what to do."""


def run_playground(
    config_path: str | None,
    host: str,
    port: int,
    *,
    expose: bool = False,
    demo: bool = False,
    browser: bool = True,
    workspaces: int = 1,
    speaker: Callable[[str], None] | None = None,
    on_ready: Callable[[SlackEmulator, str], None] | None = None,
) -> int:
    """`workspaces`: 1, the emulator's one workspace and a bot token; 2, two workspaces the app is installed in
    through OAuth. `on_ready(emulator, page URL)` is called once everything answers, on this thread: a test's look
    behind the page (raising KeyboardInterrupt stops the playground as Ctrl-C does)."""
    say = speaker or _say
    if workspaces not in (1, 2):
        raise Refused(f"the playground shows one workspace or two, not {workspaces}")
    if not is_loopback(host) and not expose:
        raise Refused(
            f"{host} is not this machine's loopback address, and {EXPOSED.format(address=host)}; "
            "pass --expose as well if that is what you want"
        )
    check_port(host, port)
    exposed = expose and not is_loopback(host)
    if exposed:
        say(f"warning: listening on {host}: {EXPOSED.format(address=host)}")
    load_config(config_path)  # a bad config is reported before anything is started or removed
    teams = [PLAYGROUND] if workspaces == 1 else list(WORKSPACES)
    with _only_one_here():
        return _serve(config_path, host, port, exposed, demo, browser, say, teams, on_ready)


def _serve(
    config_path: str | None,
    host: str,
    port: int,
    exposed: bool,
    demo: bool,
    browser: bool,
    say: Callable[[str], None],
    teams: list[Workspace],
    on_ready: Callable[[SlackEmulator, str], None] | None,
) -> int:
    environ = _own_state(dict(os.environ))
    config = load_config(config_path, environ)
    broker = prepare(config, environ, say)
    # Two workspaces: the app is installed in each through OAuth (the emulator's own team, whose token is the
    # bot token, is left out).
    oauth = len(teams) > 1

    slack = SlackEmulator(
        bot_token=f"xoxb-playground-{secrets.token_hex(12)}", team_name=TEAM, team_id="T0PLAYGROUND", history=1000
    ).start()
    model_server = None
    forge: ForgeServer | None = None
    demo_repo: tuple[ForgeServer, str] | None = None
    page: PlaygroundPage | None = None
    try:
        for workspace in teams:
            if workspace.team_id != slack.team_id:
                slack.add_team(workspace.team_id, workspace.name)
            for person in workspace.people:
                slack.add_user(person.id, person.name, real_name=person.real_name, team=workspace.team_id)
            slack.add_channel(workspace.channel_id, workspace.channel_name, team=workspace.team_id)
        model, use_demo = _model(config, demo)
        bot_port = _free_port()
        bot_url = f"http://127.0.0.1:{bot_port}"
        env = dict(environ, CELERY_BROKER_URL=broker, SLACK_API_URL=slack.url, SLACK_BOT_TOKEN=slack.bot_token)
        env["SLACK_SIGNING_SECRET"] = signing_secret = secrets.token_hex(16)
        env.pop("SLACK_APP_TOKEN", None)  # the playground speaks HTTP to its bot
        # The person's own app's OAuth client would make the bot look for installations the emulator never made.
        for name in OAUTH_ENV:
            env.pop(name, None)
        if oauth:
            # The emulator's app, its tokens from the installations bolt saves (ready() installs it); no bot token.
            del env["SLACK_BOT_TOKEN"]
            env |= {"SLACK_CLIENT_ID": slack.client_id, "SLACK_CLIENT_SECRET": slack.client_secret}
            env["SLACK_REDIRECT_URI"] = bot_url + REDIRECT_PATH  # where the emulator's authorize page sends back
        if use_demo:
            model_server = start_demo_model()
            model = ModelInfo(True, DEMO_MODEL_NAME, model_server.url, model.note)
            env |= {"MM_MODEL_URL": model_server.url, "MM_MODEL": DEMO_MODEL_NAME}
        # The demo model's script is written for its own repository; a real model works on the person's.
        if use_demo or any(not config.service.for_team(w.team_id).channel(w.channel_id).repo for w in teams):
            token = secrets.token_hex(20)
            forge, clone = _start_forge(token)
            demo_repo = forge, clone
            # The token reaches the worker through its environment alone: never the overlay, never the page.
            env |= {FORGE_TOKEN_ENV: token} | _trust(forge, environ)
        overlay = _overlay(config, demo_repo, teams)
        overlay_file = PLAYGROUND_DIR / "overlay.yaml"
        overlay_file.write_text(overlay, encoding="utf-8")
        env["MM_CONFIG_OVERLAY"] = str(overlay_file.absolute())
        load_config(config_path, env)  # the overlay must leave a config the bot and the worker accept

        page = PlaygroundPage(
            slack,
            bot_url=bot_url,
            signing_secret=signing_secret,
            workspaces=teams,
            model=model,
            overlay=overlay,
            config_path=str(config.path) if config.path else None,
            forge_url=f"{forge.base}/" if forge is not None else None,
            host=host,
            port=port,
            exposed=exposed,
        ).start()  # now: the port check above was a while ago, and the page says when the bot is not up yet

        def ready(children: list[Child]) -> None:
            assert page is not None
            say(f"bot on 127.0.0.1:{bot_port}, worker (pid {children[1].process.pid}), Slack's Web API emulated")
            if oauth:
                for workspace in teams:
                    _install(slack, bot_url, workspace)
                names = " and ".join(w.name for w in teams)
                say(f"the app is installed in {names} through Slack's OAuth flow, each with a token of its own")
            if use_demo:
                say(f"model: the demo model (scripted), since {model.note.splitlines()[0]}")
            else:
                say(f"model: {model.name} at {model.url}")
            if forge is not None:
                say(f"the demo repository is on a GitHub emulator: its pull requests at {forge.base}/")
            say(f"open {page.base} in your browser; Ctrl-C stops everything")
            if browser and _has_a_screen():
                webbrowser.open(page.base)
            if on_ready is not None:
                on_ready(slack, page.base)

        return run_services(config_path, env, "127.0.0.1", bot_port, ready, say)
    finally:
        if page is not None:
            page.stop()
        if model_server is not None:
            model_server.stop()
        if forge is not None:
            forge.stop()
        slack.stop()


def _model(config: Config, demo: bool) -> tuple[ModelInfo, bool]:
    """The configured model when it answers (and the demo was not asked for), else the demo's note."""
    url = mask_url(config.agent.model.url)
    if demo:
        return ModelInfo(True, DEMO_MODEL_NAME, "", f"you asked for it (--demo).\n{START_A_MODEL}"), True
    check = check_model(config)
    if check.ok:
        return ModelInfo(False, config.agent.model.name, url, ""), False
    return ModelInfo(True, DEMO_MODEL_NAME, "", f"no model answered: {check.detail}.\n{START_A_MODEL}"), True


def _overlay(config: Config, demo: tuple[ForgeServer, str] | None, teams: list[Workspace]) -> str:
    """The overlay: the playground's channel (one in each workspace), on the demo repository when `demo` gives it
    (the forge emulator and the repository's clone URL there)."""
    channels: dict[str, dict[str, object]] = {}
    for workspace in teams:
        channels[workspace.channel_id] = {"approvers": [_approver(workspace).id], "yolo": False}
        if demo is not None:
            channels[workspace.channel_id] |= {"repo": demo[1], "branch": "main"}
    overlay: dict[str, object] = {"channels": channels}
    if len(teams) > 1:
        # Installed through OAuth, the app serves the workspaces the config names (ServiceConfig.serves): each
        # workspace's channel in its own section.
        overlay = {"teams": {w.team_id: {"channels": {w.channel_id: channels[w.channel_id]}} for w in teams}}
    if demo is not None:
        forge = demo[0]
        overlay["forges"] = {forge.host: {"kind": forge.kind, "tokenEnv": FORGE_TOKEN_ENV}}
    header = (
        "# Laid over your config by the playground (MM_CONFIG_OVERLAY): its channel asks before every command\n"
        "# and edit, and Grace approves; your jobs report in it.\n"
    )
    if len(teams) > 1:
        approvers = " and ".join(f"{_approver(w).real_name} in {w.name}" for w in teams)
        header = (
            "# Laid over your config by the playground (MM_CONFIG_OVERLAY): its channel in each workspace asks\n"
            f"# before every command and edit: {approvers} approve. Your jobs report in {teams[0].name}'s.\n"
        )
    if demo is not None:
        header += (
            "# Its repository is on the playground's GitHub emulator: Open pull request opens one there, with a\n"
            f"# token the worker has in {FORGE_TOKEN_ENV}.\n"
        )
    if config.service.jobs:
        # The page shows one channel (the first workspace's): the jobs' runs come there as threads. A trial never
        # pushes a job's branch to the team's remote on its own (a thread's Push branch button, which an approver
        # clicks, still does).
        jobs = [job.model_dump(mode="json", exclude_defaults=True) for job in config.service.jobs]
        where = {"channel": teams[0].channel_id} | ({"team": teams[0].team_id} if len(teams) > 1 else {})
        overlay["jobs"] = [{k: v for k, v in job.items() if k != "push"} | where for job in jobs]
    return header + yaml.safe_dump(overlay, sort_keys=False, allow_unicode=True)


def _approver(workspace: Workspace) -> Person:
    return next(p for p in workspace.people if p.role == "approver")


def _install(slack: SlackEmulator, bot_url: str, workspace: Workspace) -> None:
    """Install the app in `workspace` as a person's browser does: the bot's install page (bolt issues a state,
    with its cookie), Slack's authorize page where the person clicks Allow (`approve_url`), and back to the bot's
    redirect URI with the code, the state and the cookie; bolt checks them, exchanges the code and saves the
    installation, as it would for a real workspace."""
    with httpx.Client(timeout=30) as http:
        page = http.get(bot_url + INSTALL_PATH)
        link = re.search(f'href="({re.escape(slack.authorize_url)}[^"]*)"', page.text)
        # A browser keeps bolt's cookie for 127.0.0.1 though it says Secure (a loopback origin is trustworthy);
        # httpx's jar sends a Secure cookie over HTTPS only, so it is carried here.
        cookie = page.headers.get("set-cookie", "").split(";", 1)[0]
        if page.status_code != 200 or link is None or not cookie:
            raise Refused(f"the bot's {INSTALL_PATH} answered HTTP {page.status_code} without an install link")
        allowed = http.get(slack.approve_url(html.unescape(link[1]), team=workspace.team_id))
        back = allowed.headers.get("location", "")
        if allowed.status_code != 302 or not back.startswith(bot_url + REDIRECT_PATH):
            raise Refused(f"the emulator's authorize page refused the install: {allowed.text[:300]}")
        done = http.get(back, headers={"Cookie": cookie})
        if done.status_code != 200:
            raise Refused(
                f"the app could not be installed in {workspace.name}: the bot's {REDIRECT_PATH} answered HTTP "
                f"{done.status_code} (its log says why)"
            )


def _start_forge(token: str) -> tuple[ForgeServer, str]:
    """The forge emulator and the clone URL of the demo repository it holds (DEMO_FILE, as demo_repository makes
    it), `token` its only token. Its repositories are under PLAYGROUND_DIR, fresh each run: the emulator keeps
    its pull requests in memory, so an earlier run's branches would belong to pull requests it no longer knows."""
    root = PLAYGROUND_DIR / "forge"
    shutil.rmtree(root, ignore_errors=True)
    forge = ForgeServer("github", root.absolute(), tokens={token: None}).start()
    try:
        return forge, forge.add_repo(DEMO_REPO, files={DEMO_FILE: DEMO_CONTENT})
    except BaseException:
        forge.stop()
        raise


def _trust(forge: ForgeServer, environ: dict[str, str]) -> dict[str, str]:
    """The variables by which git, httpx and requests trust the emulator's CA (ForgeServer.ca_env), naming a
    bundle that also holds what they trusted before: ca_env's file holds the emulator's CA alone, and would make
    the worker refuse every other HTTPS server (a hosted model, a page fetch_content reads, the person's own
    remotes)."""
    names = forge.ca_env()
    before = [environ[name] for name in names if environ.get(name)]
    if not before:  # the defaults: httpx's and requests' (certifi), git's (the system's, through OpenSSL)
        before = [certifi.where(), ssl.get_default_verify_paths().openssl_cafile]
    sources = dict.fromkeys(os.path.realpath(path) for path in before if os.path.isfile(path))
    pems = [Path(path).read_text(encoding="utf-8") for path in sources]
    bundle = PLAYGROUND_DIR / "ca-bundle.pem"
    bundle.write_text("\n".join([*pems, Path(names["SSL_CERT_FILE"]).read_text(encoding="utf-8")]), encoding="utf-8")
    return dict.fromkeys(names, str(bundle.absolute()))


@contextlib.contextmanager
def _only_one_here() -> Iterator[None]:
    """One playground a directory: a second would wipe the first's database and workspaces (_own_state)."""
    PLAYGROUND_DIR.mkdir(parents=True, exist_ok=True)
    with (PLAYGROUND_DIR / "lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Refused(
                f"another playground runs from this directory ({PLAYGROUND_DIR}): open it, stop it, or start this "
                "one from another directory"
            ) from None
        yield  # the lock goes with the file's closing, also when the process dies


def _own_state(environ: dict[str, str]) -> dict[str, str]:
    """The environment with the playground's own database and workspaces, fresh each run, where the person
    named none: its Slack lives in memory, so sessions kept from an earlier run would name threads that no
    longer exist (and a later `make run` with real Slack must not resume them)."""
    if not environ.get("DATABASE_URL"):
        database = PLAYGROUND_DIR / "mm.sqlite3"
        database.unlink(missing_ok=True)
        environ["DATABASE_URL"] = f"sqlite:///{database.absolute()}"
    if not environ.get("MM_WORKSPACES"):
        workspaces = PLAYGROUND_DIR / "workspaces"
        shutil.rmtree(workspaces, ignore_errors=True)
        environ["MM_WORKSPACES"] = str(workspaces.absolute())
    PLAYGROUND_DIR.mkdir(parents=True, exist_ok=True)
    return environ


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _has_a_screen() -> bool:
    # On a server, webbrowser would start a text browser in this terminal: open one only where a desktop is.
    return sys.platform == "darwin" or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _say(message: str) -> None:
    print(f"mm-bot playground: {message}", flush=True)
