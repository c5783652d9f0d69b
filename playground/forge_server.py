"""An emulator of a forge (GitHub / GitHub Enterprise, GitLab, or Gitea / Forgejo) on 127.0.0.1 over HTTPS: the
REST API a pull request is opened, updated and followed through, and git over HTTPS, with state.

    with ForgeServer("github", tmp_path, tokens={"t0k": ["acme/app"]}) as forge:
        clone_url = forge.add_repo("acme/app")
        gh = githubkit.GitHub(TokenAuthStrategy("t0k"), base_url=forge.api_url, ssl_verify=forge.ssl_context_client())
        gh.rest.pulls.create("acme", "app", head="topic", base="main", title="T")

It is as useful as it is strict: it refuses what the forge refuses, with the forge's status and words, and its
answers parse with the official clients' own models (tests/test_kit_forge.py proves both with githubkit,
python-gitlab and pyforgejo). What a client is given (`api_url`), per kind:

- github: `{base}/api/v3`, GitHub Enterprise Server's shape (githubkit's `base_url`);
- gitlab: `{base}` (python-gitlab's `url`; it appends /api/v4 itself);
- gitea: `{base}/api/v1` (pyforgejo's `base_url`: it appends nothing).

TLS: a CA made at start (playground/forge_tls.py) signs the server's certificate; `ca_file` holds it, and
`ca_env()` names it in the variables httpx (SSL_CERT_FILE), requests (REQUESTS_CA_BUNDLE) and git (GIT_SSL_CAINFO)
read. Repositories are private: every API and git request needs a token of `tokens` (or a GitHub App's
installation token), and only a token with rights on a repository may write to it (API) or push to it (git).

Elsewhere than 127.0.0.1: given `sock`, a listening socket made beforehand (one in a test's network namespace,
mm_testkit/netlab.py), it serves on that; `names` are the host names its certificate holds besides localhost and
its address, the first being the one its URLs carry (`https://git.forge.test:<port>`).

Every request is recorded in `requests` as (method, path, token or None). A call the emulator does not know
(an unknown route, a query parameter it does not emulate) answers 501 and is recorded in `unsupported`: the test
kit fails the test that made one (mm_testkit/fixtures_forge.py), since the forge would have done something the
emulator cannot say.

The API modules (playground/forge_github.py, forge_gitlab.py, forge_gitea.py) hold each forge's routes and
shapes; this module holds the state they share, authentication, git, and the HTML pages a person opens.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as dt
import html
import itertools
import json
import re
import secrets
import shutil
import socket
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote

from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from playground import forge_git, forge_tls
from playground.forge_state import (
    KINDS,
    ApiError,
    App,
    Call,
    CheckState,
    Identity,
    Kind,
    Pull,
    Repo,
    Review,
    ReviewState,
    Unsupported,
    now,
)
from playground.server_thread import ThreadedAiohttpServer

# The user every token of `tokens` acts as, and the people a review may be requested from (add_user adds more).
BOT_USER = "mm-bot"
DEFAULT_USERS = (BOT_USER, "alice", "bob")
GIT_PATH = re.compile(r"^/(?P<repo>.+?\.git)(?P<rest>/(?:info/refs|git-upload-pack|git-receive-pack))$")
# What each forge's git says when a push to a protected branch is refused (its pre-receive check's words).
PUSH_REFUSALS: dict[Kind, Callable[[str], list[str]]] = {
    "github": lambda b: [
        f"error: GH006: Protected branch update failed for refs/heads/{b}.",
        "error: Changes must be made through a pull request.",
    ],
    "gitlab": lambda b: ["GitLab: You are not allowed to push code to protected branches on this project."],
    "gitea": lambda b: [f"Gitea: Not allowed to push to protected branch {b}"],
}


class ForgeServer(ThreadedAiohttpServer):
    """One forge of `kind` over HTTPS, its bare repositories under `root`.

    `tokens`: token -> the repository paths it may write (None: every repository); any other token is refused.
    `sock`: a listening socket to serve on (else a port of 127.0.0.1); `names`: the host names it is reached by.
    """

    def __init__(
        self,
        kind: Kind,
        root: Path,
        tokens: Mapping[str, Iterable[str] | None] | None = None,
        *,
        sock: socket.socket | None = None,
        names: Iterable[str] = (),
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        super().__init__(sock=sock)
        self.names = tuple(names)
        self.kind: Kind = kind
        self.root = Path(root)
        self.tokens: dict[str, Identity] = {
            token: Identity(token, BOT_USER, None if repos is None else frozenset(repos))
            for token, repos in (tokens or {}).items()
        }
        self.users: list[str] = list(DEFAULT_USERS)
        self.repos: dict[str, Repo] = {}
        self.pulls_by_repo: dict[str, list[Pull]] = {}
        self.checks: dict[tuple[str, str], list[tuple[str, CheckState]]] = {}
        self.statuses: dict[tuple[str, str], list[tuple[str, CheckState]]] = {}  # GitHub's commit statuses
        self.apps: dict[int, App] = {}
        self.app_token_seconds = 3600
        self.rate_limited_until: dt.datetime | None = None
        self.rate_limit_status = 403
        self.requests: list[tuple[str, str, str | None]] = []
        self.unsupported: list[str] = []
        self.ca_file: Path | None = None
        self._tmp: Path | None = None
        self._ids = itertools.count(1001)
        self._lock = threading.RLock()
        self.git_env = forge_git.git_env(self.root)

    # -- lifecycle, addresses, TLS ---------------------------------------------------------------------------

    @property  # pyright: ignore[reportIncompatibleVariableOverride] - the bind address is kept in _bind
    def host(self) -> str:
        """`127.0.0.1:<port>` once started (`<first of names>:<port>` with `names`): the URL's netloc, what
        `forges.<host>` keys on."""
        shown = self.names[0] if self.names else self._bind
        return f"{shown}:{self.port}" if self.port else shown

    @host.setter
    def host(self, value: str) -> None:
        self._bind = value

    @property
    def base(self) -> str:
        """`https://127.0.0.1:<port>` (`https://<first name>:<port>` with `names`)."""
        if not self.port:
            raise RuntimeError("ForgeServer is not started")
        return f"https://{self.host}"

    @property
    def api_url(self) -> str:
        """What the kind's official client is given (see the module's docstring)."""
        return {"github": f"{self.base}/api/v3", "gitlab": self.base, "gitea": f"{self.base}/api/v1"}[self.kind]

    def start(self) -> ForgeServer:
        self.root.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(tempfile.mkdtemp(prefix="mm-forge-"))
        certs = forge_tls.make_certificates((*self.names, self._bind))
        self.ca_file = self._tmp / "ca.pem"
        self.ca_file.write_bytes(certs.ca_pem)
        self.ssl_context = forge_tls.server_context(certs)
        super().start()
        return self

    def stop(self) -> None:
        super().stop()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def ca_env(self) -> dict[str, str]:
        """The variables by which httpx (githubkit, pyforgejo), requests (python-gitlab) and git trust the CA."""
        assert self.ca_file is not None, "ForgeServer is not started"
        ca = str(self.ca_file)
        return {"SSL_CERT_FILE": ca, "REQUESTS_CA_BUNDLE": ca, "GIT_SSL_CAINFO": ca}

    def client_ssl_context(self) -> ssl.SSLContext:
        """A client context trusting this server's CA only: for clients that take one (httpx, githubkit)."""
        assert self.ca_file is not None, "ForgeServer is not started"
        return ssl.create_default_context(cafile=str(self.ca_file))

    # -- state a test sets up ----------------------------------------------------------------------------------

    def add_repo(
        self,
        path: str,
        files: Mapping[str, str] | None = None,
        default_branch: str = "main",
        labels: Iterable[str] = ("bug", "enhancement"),
    ) -> str:
        """A private repository `path` (bare, under root/<path>.git) with one commit of `files` (a README by
        default) on `default_branch`, and `labels`; returns its clone URL `{base}/{path}.git`."""
        segments = path.split("/")
        if (self.kind != "gitlab" and len(segments) != 2) or len(segments) < 2 or "" in segments:
            raise ValueError(f"{path!r} is not a repository path of {self.kind} (owner/name)")
        with self._lock:
            if path in self.repos:
                raise ValueError(f"{path} exists")
            git_dir = self.root / f"{path}.git"
            forge_git.create_bare(git_dir, files or {"README.md": "hello\n"}, default_branch, self.git_env)
            ids = {name: next(self._ids) for name in labels}
            self.repos[path] = Repo(path, next(self._ids), git_dir, default_branch, ids)
            self.pulls_by_repo[path] = []
        return f"{self.base}/{path}.git"

    def add_user(self, login: str) -> None:
        """A person a review may be requested from (a collaborator of every repository)."""
        with self._lock:
            if login not in self.users:
                self.users.append(login)

    def pulls(self, path: str) -> list[dict[str, Any]]:
        """The repository's pull requests (GitLab: merge requests), oldest first, head shas read now."""
        repo = self.repo(path)
        heads = forge_git.branches(repo.git_dir, self.git_env)
        with self._lock:
            return [
                {
                    "number": p.number,
                    "state": p.state,
                    "draft": p.draft(self.kind),
                    "title": p.title,
                    "body": p.body,
                    "head": p.head,
                    "head_sha": self.refresh(p, heads),
                    "base": p.base,
                    "labels": list(p.labels),
                    "reviewers": list(p.reviewers),
                    "author": p.author,
                    "url": self.html_url(p),
                }
                for p in self.pulls_by_repo[path]
            ]

    def close(self, path: str, number: int, merged: bool = False) -> None:
        """Closes (or merges) a pull request, as a person on the forge's page would."""
        pull = self.pull(path, number)
        with self._lock:
            pull.state = "merged" if merged else "closed"
            pull.closed = pull.updated = now()
            pull.merged = pull.closed if merged else None

    def set_checks(
        self,
        path: str,
        sha: str,
        checks: Iterable[tuple[str, CheckState]],
        *,
        github_as: Literal["check_runs", "statuses"] = "check_runs",
    ) -> None:
        """The checks on commit `sha`, (name, state) with state pending|success|failure|neutral. The API shows them
        as the forge does: GitHub's check runs (or, with github_as="statuses", its commit statuses, where neutral
        is success), GitLab's commit statuses and the pipeline they make, Gitea's commit statuses (neutral is
        its `warning`)."""
        checks = list(checks)
        for name, state in checks:
            if state not in ("pending", "success", "failure", "neutral"):
                raise ValueError(f"check {name}: state {state!r}")
        repo = self.repo(path)
        full = forge_git.commit_exists(repo.git_dir, self.git_env, sha)
        if full is None:
            raise ValueError(f"{path} has no commit {sha}")
        with self._lock:
            (self.statuses if github_as == "statuses" else self.checks)[(path, full)] = checks

    def set_review(self, path: str, number: int, user: str, state: ReviewState) -> None:
        """`user` approves or requests changes on the pull request."""
        if state not in ("approved", "changes_requested"):
            raise ValueError(f"review state {state!r}")
        pull = self.pull(path, number)
        self.add_user(user)
        with self._lock:
            pull.reviews.append(Review(next(self._ids), user, state, now()))

    def limit_rate(self, until: dt.datetime, status: int = 403) -> None:
        """Every API call is refused as the forge does when its rate limit is used up, until `until` (GitHub
        answers 403, or 429 with `status=429`; GitLab and Gitea answer 429)."""
        self.rate_limited_until, self.rate_limit_status = until, status

    def protect(self, path: str, branch: str, message: str | None = None) -> None:
        """Protects `branch`: a push to it is refused by the repository's pre-receive hook in the forge's words,
        and opening a pull request into it is refused by the API with `message` (the forge's words by default).
        Real forges let a pull request into a protected branch be opened; this is for a test of the refusal."""
        repo = self.repo(path)
        with self._lock:
            repo.protected[branch] = message
            rules = {f"refs/heads/{b}": PUSH_REFUSALS[self.kind](b) for b in repo.protected}
        forge_git.set_protected(repo.git_dir, rules)

    def new_app(self) -> tuple[int, str]:
        """GitHub only: registers a GitHub App, installed on every repository; returns (app_id, private key PEM)."""
        if self.kind != "github":
            raise ValueError("GitHub Apps are GitHub's")
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        with self._lock:
            app = App(next(self._ids), "", key, next(self._ids))
            app.slug = f"mm-app-{app.id}"
            self.apps[app.id] = app
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
        return app.id, pem.decode()

    def take_unsupported(self) -> list[str]:
        """The unsupported calls so far, forgotten: for a test that makes one on purpose."""
        with self._lock:
            taken, self.unsupported = self.unsupported, []
        return taken

    # -- state the API modules share ---------------------------------------------------------------------------

    def repo(self, path: str) -> Repo:
        try:
            return self.repos[path]
        except KeyError:
            raise KeyError(f"no repository {path}") from None

    def pull(self, path: str, number: int) -> Pull:
        for p in self.pulls_by_repo[self.repo(path).path]:
            if p.number == number:
                return p
        raise KeyError(f"{path} has no pull request {number}")

    def next_id(self) -> int:
        return next(self._ids)

    def refresh(self, pull: Pull, heads: Mapping[str, str]) -> str:
        """The pull request's head sha, moved to its branch's head when the branch moved."""
        if (sha := heads.get(pull.head)) is not None and sha != pull.head_sha:
            pull.head_sha = sha
        if pull.state == "open" and (base := heads.get(pull.base)) is not None:
            pull.base_sha = base
        return pull.head_sha

    async def heads(self, repo: Repo) -> dict[str, str]:
        return await asyncio.to_thread(forge_git.branches, repo.git_dir, self.git_env)

    def html_url(self, pull: Pull) -> str:
        where = {"github": "pull", "gitlab": "-/merge_requests", "gitea": "pulls"}[self.kind]
        return f"{self.base}/{pull.repo.path}/{where}/{pull.number}"

    def identity(self, token: str | None) -> Identity | None:
        """The token's identity, None for an unknown or expired one."""
        if token is None:
            return None
        who = self.tokens.get(token)
        if who is None or (who.expires is not None and who.expires <= now()):
            return None
        return who

    def issue_installation_token(self, app: App) -> Identity:
        token = "ghs_" + secrets.token_hex(18)
        who = Identity(
            token,
            f"{app.slug}[bot]",
            None,
            bot=True,
            expires=now() + dt.timedelta(seconds=self.app_token_seconds),
            installation_id=app.installation_id,
        )
        with self._lock:
            self.tokens[token] = who
        return who

    def rate_limited(self) -> dt.datetime | None:
        until = self.rate_limited_until
        return until if until is not None and until > dt.datetime.now(dt.UTC) else None

    # -- the application ---------------------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        from playground import forge_gitea, forge_github, forge_gitlab

        api = {"github": forge_github, "gitlab": forge_gitlab, "gitea": forge_gitea}[self.kind]
        self._api = api
        app = web.Application(client_max_size=200 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        return app

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.raw_path.split("?", 1)[0]
        if path.startswith(self._api.PREFIX + "/") or path == self._api.PREFIX:
            return await self._api_call(request, path[len(self._api.PREFIX) :])
        if (m := GIT_PATH.match(unquote(path))) is not None:
            return await self._git(request, m["repo"], m["rest"])
        self.requests.append((request.method, unquote(path), None))
        if request.method != "GET":
            raise web.HTTPNotFound()
        return self._page(unquote(path))

    async def _api_call(self, request: web.Request, path: str) -> web.StreamResponse:
        api = self._api
        token = api.token_of(request)
        self.requests.append((request.method, request.path, token))
        found = next(
            (
                (h, m)
                for method, pattern, h in api.ROUTES
                if method == request.method and (m := pattern.fullmatch(path))
            ),
            None,
        )
        if found is None:
            return self._unsupported(request, f"{request.method} {path}")
        handler, m = found
        try:
            body = await self._body(request)
            who = self.identity(token)
            if who is None and not getattr(handler, "own_auth", False):
                raise api.unauthorized(self, token)
            if (until := self.rate_limited()) is not None:
                raise api.rate_limited(self, until, who)
            call = Call(
                request,
                request.method,
                {k: unquote(v) for k, v in m.groupdict().items()},
                request.query,
                body,
                who,
                token,
            )
            response = await handler(self, call)
        except ApiError as refused:
            if isinstance(refused.body, str):  # GitLab's rate limit answers text
                response = web.Response(text=refused.body, status=refused.status, headers=refused.headers)
            else:
                response = web.json_response(refused.body, status=refused.status, headers=refused.headers)
        except Unsupported as gap:
            return self._unsupported(request, f"{request.method} {path}: {gap}")
        api.decorate(self, request, response)
        return response

    async def _body(self, request: web.Request) -> Any:
        if request.method in ("GET", "HEAD", "DELETE") or not request.can_read_body:
            return None
        raw = await request.read()
        ctype = request.content_type
        if ctype == "application/x-www-form-urlencoded":
            return dict((await request.post()).items())
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise self._api.bad_json(self) from None

    def _unsupported(self, request: web.Request, what: str) -> web.Response:
        with self._lock:
            self.unsupported.append(what)
        return web.json_response({"message": f"not emulated by ForgeServer({self.kind}): {what}"}, status=501)

    async def _git(self, request: web.Request, repo_dir: str, rest: str) -> web.StreamResponse:
        user, token = _basic_auth(request)
        self.requests.append((request.method, unquote(request.path), token))
        challenge = {"WWW-Authenticate": f'Basic realm="{_REALMS[self.kind]}"'}
        who = self.identity(token)
        if who is None:
            return web.Response(status=401, text="HTTP Basic: Access denied\n", headers=challenge)
        path = repo_dir.removesuffix(".git")
        if path not in self.repos:
            return web.Response(status=404, text="Repository not found.\n")
        pushing = rest.endswith("git-receive-pack") or request.query.get("service") == "git-receive-pack"
        if pushing and not who.may_write(path):
            return web.Response(status=403, text=f"Permission to {path}.git denied to {who.login}.\n")
        return await forge_git.http_backend(request, self.root, f"/{repo_dir}{rest}", user or who.login, self.git_env)

    # -- the pages a person opens ------------------------------------------------------------------------------

    def _page(self, path: str) -> web.Response:
        if path == "/":
            return _html("Pull requests", self._list_html())
        m = re.fullmatch(r"/(?P<repo>.+)/(?:pull|-/merge_requests|pulls)/(?P<n>\d+)", path)
        if m is None or m["repo"] not in self.repos:
            raise web.HTTPNotFound()
        try:
            pull = self.pull(m["repo"], int(m["n"]))
        except KeyError:
            raise web.HTTPNotFound() from None
        if self.html_url(pull) != f"{self.base}{path}":
            raise web.HTTPNotFound()  # another forge's page shape
        e = html.escape
        draft = " (draft)" if pull.draft(self.kind) else ""
        body = (
            f"<h1>{e(pull.title)} <span class=number>#{pull.number}</span></h1>"
            f"<p class=state>{e(pull.state)}{draft}</p>"
            f"<p>{e(pull.author)} wants to merge <code>{e(pull.head)}</code> into <code>{e(pull.base)}</code></p>"
            f"<pre class=body>{e(pull.body)}</pre>"
        )
        return _html(pull.title, body)

    def _list_html(self) -> str:
        e = html.escape
        rows = [
            f'<li><a href="{e(self.html_url(p))}">{e(p.repo.path)}#{p.number} {e(p.title)}</a> '
            f"<span class=state>{e(p.state)}</span></li>"
            for pulls in self.pulls_by_repo.values()
            for p in pulls
        ]
        return f"<h1>Pull requests</h1><ul>{''.join(rows)}</ul>"


_REALMS: dict[Kind, str] = {"github": "GitHub", "gitlab": "GitLab", "gitea": "Gitea"}


def _basic_auth(request: web.Request) -> tuple[str | None, str | None]:
    """(username, password) of an HTTP Basic Authorization header; (None, None) without a readable one."""
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None, None
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None, None
    return (user, password) if sep else (None, None)


def _html(title: str, body: str) -> web.Response:
    page = (
        f"<!DOCTYPE html><html><head><meta charset=utf-8><title>{html.escape(title)}</title></head>"
        f"<body>{body}</body></html>"
    )
    return web.Response(text=page, content_type="text/html")
