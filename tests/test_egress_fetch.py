"""fetch_content obeys the egress policy of the sandbox's commands (issue 26): the same allow-list, asked of every
host it connects to (redirects and robots.txt included), before the SSRF guard's check of the addresses.

The sites are on loopback addresses, which the SSRF guard refuses unless `fetchAllow` lifts it: each test lifts
it, so that what refuses here is the policy alone.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fetch_site import Site
from mm_core.config import AgentConfig, NetworkConfig
from mm_core.tools.base import ToolContext
from mm_core.tools.fetch import FetchContentTool

PAGE = "<h1>Title</h1><p>Body text.</p>"
LIFTED = ["127.0.0.1", "127.0.0.2"]


async def fetch(tmp_path: Path, url: str, network: Any) -> str:
    config = AgentConfig(fetchAllow=LIFTED, network=network)
    return await FetchContentTool(config).run({"url": url}, ToolContext(workspace=tmp_path, config=config))


def test_a_host_outside_the_allow_list_is_refused_in_the_policys_words_and_never_contacted(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site:
            site.page("/p", PAGE)
            out = await fetch(tmp_path, site.url("/p"), {"allow": ["registries"]})
            return out, site.total

    out, hits = asyncio.run(scenario())
    assert out == ("[fetch_content: error 2 (input) — network: host 127.0.0.1 is not in this channel's allow-list]")
    assert hits == 0


def test_a_listed_host_and_port_is_fetched(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site:
            site.page("/p", PAGE)
            return await fetch(tmp_path, site.url("/p"), {"allow": [f"127.0.0.1:{site.port}"]})

    assert asyncio.run(scenario()) == "# Title\n\nBody text.\n"


def test_a_listed_host_on_another_port_is_refused(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site:
            site.page("/p", PAGE)
            out = await fetch(tmp_path, site.url("/p"), {"allow": ["127.0.0.1"]})  # 80 and 443 only
            return out, site.total, site.port

    out, hits, port = asyncio.run(scenario())
    refusal = f"network: port {port} of 127.0.0.1 is not in this channel's allow-list"
    assert out == f"[fetch_content: error 2 (input) — {refusal}]"
    assert hits == 0


def test_a_redirect_to_a_host_outside_the_list_is_refused_on_that_hop(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as listed, Site("127.0.0.2") as other:
            other.page("/secret", PAGE)
            listed.redirect("/go", other.url("/secret"))
            out = await fetch(tmp_path, listed.url("/go"), {"allow": [f"127.0.0.1:{listed.port}"]})
            return out, listed.hits, other.total

    out, listed_hits, other_hits = asyncio.run(scenario())
    assert out == "[fetch_content: error 2 (input) — network: host 127.0.0.2 is not in this channel's allow-list]"
    assert listed_hits == {"/robots.txt": 1, "/go": 1} and other_hits == 0


def test_network_off_refuses_every_fetch(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site:
            site.page("/p", PAGE)
            out = await fetch(tmp_path, site.url("/p"), "off")
            return out, site.total

    out, hits = asyncio.run(scenario())
    assert out == "[fetch_content: error 2 (input) — network: this channel's network is off]"
    assert hits == 0


def test_open_still_refuses_internal_addresses_without_the_lift(tmp_path: Path) -> None:
    config = AgentConfig(network=NetworkConfig(policy="open"))
    out = asyncio.run(
        FetchContentTool(config).run({"url": "http://127.0.0.1:9/"}, ToolContext(workspace=tmp_path, config=config))
    )
    assert out.startswith("[fetch_content: error 2 (input) — 127.0.0.1 is a loopback address")


def test_the_call_takes_the_policy_of_its_context_not_the_tools(tmp_path: Path) -> None:
    """A channel's policy reaches fetch_content through the call's config (the worker's per-thread config), whatever
    the registry's tool was built with."""

    async def scenario():
        async with Site() as site:
            site.page("/p", PAGE)
            tool = FetchContentTool(AgentConfig(fetchAllow=LIFTED, network=NetworkConfig(policy="open")))
            channel = AgentConfig(fetchAllow=LIFTED, network=NetworkConfig(allow=["github.com"]))
            return await tool.run({"url": site.url("/p")}, ToolContext(workspace=tmp_path, config=channel)), site.total

    out, hits = asyncio.run(scenario())
    assert "network: host 127.0.0.1 is not in this channel's allow-list" in out and hits == 0
