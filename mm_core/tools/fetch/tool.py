"""The `fetch_content` tool: a web page as Markdown, for the model or into a file of the workspace."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mm_core.config import AgentConfig
from mm_core.events import Status
from mm_core.network.policy import EgressPolicy
from mm_core.tools import workspace
from mm_core.tools.base import Tool, ToolContext
from mm_core.tools.fetch import encoding
from mm_core.tools.fetch.errors import CONVERSION, INPUT, USAGE, FetchError
from mm_core.tools.fetch.guard import AddressGuard
from mm_core.tools.fetch.http import Fetcher, Limits, make_client, parse_url
from mm_core.tools.fetch.robots import RESOURCE_KEY, RobotsCache
from mm_core.tools.fetch.webmd import Options, PageTooComplex, to_markdown
from mm_core.tools.text import truncate

_SCHEME_NO_COLON = re.compile(r"^(https?)//", re.I)
_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*):(?!\d+(?:[/?#]|$))", re.I)

_OUTSIDE = "the path leads outside the working directory"
# What no check foresaw and the network, memory or the stack can still raise on a hostile page: a text, never
# an exception out of run().
UNFORESEEN = (OSError, MemoryError, RecursionError, ValueError)

DESCRIPTION = (
    "Download a web page and get its text as Markdown (scripts, menus and ads removed). "
    "Use it to read documentation or an article from a URL. "
    "Set output to save the Markdown to a file instead of reading it here."
)


def normalize_url(raw: str) -> str:
    """The URL to fetch: `https://` added when the scheme is missing, `https//` repaired; FetchError(usage)
    for anything that is not an absolute http(s) URL."""
    url = raw.strip()
    if not url:
        raise FetchError(USAGE, "url is empty — give the page's address, e.g. https://example.com/docs")
    url = _SCHEME_NO_COLON.sub(lambda m: m.group(1) + "://", url)
    if "://" not in url and not _SCHEME.match(url):
        url = "https://" + url.lstrip("/")
    try:
        parts = parse_url(url)
    except ValueError as exc:
        raise FetchError(USAGE, f"cannot parse url {raw!r}: {exc}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise FetchError(USAGE, f"scheme {parts.scheme!r} is not supported in {raw!r} — only http and https")
    if not parts.hostname or any(c.isspace() for c in parts.netloc):
        raise FetchError(USAGE, f"cannot parse url {raw!r}: no host name")
    # Credentials in a URL would be sent to whatever host the page redirects to, and `user@host` forms are a
    # classic way to make an address read as another one: such URLs are refused, not stripped silently.
    if parts.username is not None or parts.password is not None:
        raise FetchError(USAGE, f"{raw!r} carries a user name or password — URLs with credentials are not fetched")
    return url


def _reason(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "not enough memory"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).strip() or type(exc).__name__


def _flag(args: dict[str, Any], name: str) -> bool:
    value = args.get(name, False)
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", ""):
        return value.strip().lower() == "true"
    raise FetchError(USAGE, f"{name} must be true or false, not {value!r}")


def _text(args: dict[str, Any], name: str, default: str = "") -> str:
    value = args.get(name, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise FetchError(USAGE, f"{name} must be a string, not {value!r}")
    return value


class FetchContentTool(Tool):
    name = "fetch_content"
    emoji = "🌐"
    counter = None

    def __init__(self, config: AgentConfig, limits: Limits = Limits()):
        self.config = config
        self.limits = limits

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {
                    "url": {
                        "type": "string",
                        "description": "The page, e.g. https://docs.python.org/3/library/re.html",
                    },
                    "output": {
                        "type": "string",
                        "description": (
                            "Optional file to save the Markdown to, relative to the working directory. "
                            "When set, the Markdown is not returned."
                        ),
                    },
                    "baseUrl": {
                        "type": "string",
                        "description": (
                            "Optional absolute URL to resolve relative links against. Default: the page's URL."
                        ),
                    },
                    "tables": {
                        "type": "string",
                        "enum": ["html", "flatten"],
                        "description": (
                            "Tables with merged cells: html keeps them as HTML (default), "
                            "flatten makes a Markdown table."
                        ),
                    },
                    "strikethrough": {
                        "type": "boolean",
                        "description": "Keep struck-out text as ~~text~~ (default false).",
                    },
                    "taskList": {
                        "type": "boolean",
                        "description": "Keep checkboxes of list items as - [ ] / - [x] (default false).",
                    },
                },
                "required": ["url"],
            },
        }

    def needs_approval(self, args: dict[str, Any]) -> bool:
        return bool(args.get("output"))

    def title(self, args: dict[str, Any]) -> str:
        line = f"{self.name}: {args.get('url', '')}"
        return f"{line} → {args['output']}" if args.get("output") else line

    async def preview(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """The title; when `output` goes through a symlink, naming the file the page is written to."""
        output = args.get("output") if isinstance(args, dict) else None
        if not isinstance(output, str) or not output.strip():
            return self.title(args)
        try:
            real = workspace.resolve(ctx.workspace, output.strip())
        except workspace.WorkspaceError:
            return self.title(args)  # refused when it runs, in the tool's words
        named = workspace.shown_path(ctx.workspace, output.strip(), real)
        return self.title(args) if named == output.strip() else f"{self.name}: {args.get('url', '')} → {named}"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            return await self._run(args, ctx)
        except FetchError as exc:
            return exc.text()
        except UNFORESEEN as exc:
            return FetchError(CONVERSION, f"the page could not be handled: {_reason(exc)}").text()

    async def _run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        if not isinstance(args, dict):
            raise FetchError(USAGE, "the arguments must be a JSON object with at least url")
        url = normalize_url(_text(args, "url"))
        tables = _text(args, "tables", "html").strip().lower() or "html"
        if tables not in ("html", "flatten"):
            raise FetchError(USAGE, f'tables must be "html" or "flatten", not {args["tables"]!r}')
        base = _text(args, "baseUrl").strip()
        if base and not (urlsplit(base).scheme and urlsplit(base).netloc):
            raise FetchError(USAGE, f"baseUrl {base!r} is not an absolute URL (like https://example.com/docs/)")
        strike, tasks = _flag(args, "strikethrough"), _flag(args, "taskList")
        output = _text(args, "output").strip()
        target = self._target(ctx.workspace, output) if output else None

        ctx.emit(Status("Fetching"))
        robots = await ctx.resources.get(RESOURCE_KEY, RobotsCache)
        try:
            async with make_client(self._guard(ctx.config), self.limits.timeout) as client:
                page = await Fetcher(client, robots, self.limits).fetch(url)
        except (OSError, ValueError) as exc:  # what httpx lets through unwrapped
            raise FetchError(INPUT, f"fetching {url} failed: {_reason(exc)}") from None
        options = Options(base or page.url, tables, strike, tasks)
        markdown = await asyncio.to_thread(self._convert, page.body, page.content_type, options, url)
        if not markdown:
            return (
                f"[fetch_content: {url} has no text content once scripts, navigation and ads are removed "
                "— nothing saved]"
            )
        if target is None:
            return truncate(markdown, self.config.maxOutput)
        data = markdown.encode("utf-8")
        try:
            workspace.write_bytes(ctx.workspace, target, data)
        except (OSError, workspace.WorkspaceError) as exc:
            reason = _OUTSIDE if isinstance(exc, workspace.WorkspaceError) else exc.strerror or str(exc)
            raise FetchError(CONVERSION, f"cannot write {output}: {reason}") from None
        return (
            f"[fetch_content: saved {markdown.count(chr(10))} lines of Markdown ({len(data)} bytes) from {url} "
            f"to {output} — the content is not shown]"
        )

    @staticmethod
    def _guard(config: AgentConfig) -> AddressGuard:
        """The call's door: the channel's egress policy (the one its commands have, mm_core/network) asked of every
        host, redirects and robots.txt included, then the SSRF guard's check of its addresses. fetch_content never
        adds the policy's credentials: what it reads is shown to the model, so it gets only public pages."""
        return AddressGuard(config.fetchAllow, policy=EgressPolicy.of(config.egress, {}))

    @staticmethod
    def _target(root: Path, output: str) -> Path:
        try:
            target = workspace.resolve(root, output)
        except workspace.WorkspaceError:
            raise FetchError(CONVERSION, f"cannot write {output}: {_OUTSIDE}") from None
        try:
            is_dir = target.is_dir()
        except OSError as exc:  # a name too long for the file system, say: is_dir() does not swallow that
            raise FetchError(CONVERSION, f"cannot write {output}: {exc.strerror or exc}") from None
        if is_dir:
            raise FetchError(CONVERSION, f"cannot write {output}: it is a directory")
        return target

    @staticmethod
    def _convert(body: bytes, content_type: str | None, options: Options, url: str) -> str:
        try:
            html = encoding.decode(body, content_type)
        except (LookupError, UnicodeError) as exc:
            raise FetchError(CONVERSION, f"{url} cannot be decoded: {exc}") from None
        try:
            return to_markdown(html, options)
        except RecursionError:
            raise FetchError(CONVERSION, f"{url} is nested too deeply to convert") from None
        except PageTooComplex as exc:
            raise FetchError(CONVERSION, f"{url} {exc} — refused") from None
        except MemoryError:
            raise FetchError(CONVERSION, f"{url} takes more memory to convert than there is") from None
