"""Which repositories the worker's tokens are for: those the operator's config names. One owner, read by the
push (workers/push.py: MM_GIT_TOKEN's credentials) and by the forges (workers/forges: their tokens), so a
repository a Slack user picked elsewhere never gets either."""

from __future__ import annotations

from urllib.parse import urlsplit

from chatops.config import Config
from workers.workspaces import public_url


def token_scope(config: Config) -> tuple[set[str], tuple[str, ...]]:
    """The HTTPS repositories the token is for: those the config names (channels' and jobs' repositories, push
    remotes; every workspace's `teams` section's too), and every repository under an owner a channel's `repos`
    pattern spells out (`https://host/owner/…`; a wildcard host or owner names none)."""
    service = config.service
    channels = service.all_channels()
    named = [c.repo for c in channels] + [j.repo for j in service.jobs]
    named += [j.push.remote for j in service.jobs if j.push is not None]
    exact = {u for u in (normal_url(n) for n in named if n) if u}
    owners = set()
    for pattern in (p for c in channels for p in c.repos):
        parts = pattern.split("/")  # https: '' host owner …
        if len(parts) > 4 and pattern.startswith("https://") and not any("*" in p for p in parts[2:4]) and parts[3]:
            owners.add(f"https://{parts[2].lower()}/{parts[3]}/")
    return exact, tuple(sorted(owners))


def normal_url(url: str) -> str | None:
    """An HTTPS URL without its user part, its trailing `/` or `.git`, its host in lower case; None for others."""
    try:
        parts = urlsplit(public_url(url))
    except ValueError:
        return None
    if parts.scheme != "https" or not parts.hostname:
        return None
    return f"https://{parts.netloc.lower()}{parts.path.rstrip('/').removesuffix('.git')}"
