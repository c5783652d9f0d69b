"""The egress policy (issue 26): what `network:` accepts and refuses in the config, and the one decision the proxy
and fetch_content take from it."""

from __future__ import annotations

import base64
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from chatops.config import ConfigError, example_config, load_config
from mm_core.config import AgentConfig
from mm_core.events import NetworkUsed
from mm_core.network import EgressPolicy, expand, presets
from mm_core.network.policy import NO_SECRET
from mm_core.network.tap import Tap
from mm_core.tools.ask_agent import load_agent_file
from mm_core.tools.base import ToolContext
from mm_core.tools.bash import network_said as bash_network_said
from slackio.metrics import NETWORK_CONNECTIONS, NETWORK_HOST_LABELS, network_used
from workers.egress import with_thread_network

NOT_LISTED = "network: host {} is not in this channel's allow-list"


def policy(network: object, environ: dict[str, str] | None = None) -> EgressPolicy:
    return EgressPolicy.of(AgentConfig.model_validate({"network": network}).egress, environ or {})


def test_a_config_without_network_gets_the_registries_and_nothing_else() -> None:
    network = AgentConfig().egress
    assert network.policy == "allow" and network.allow == ["registries"] and not network.credentials
    p = EgressPolicy.of(network, {})
    assert p.refusal("pypi.org", 443) is None and p.refusal("files.pythonhosted.org", 443) is None
    assert p.refusal("registry.npmjs.org", 443) is None
    assert p.refusal("example.com", 443) == NOT_LISTED.format("example.com")
    assert p.refusal("github.com", 443) == NOT_LISTED.format("github.com")  # the forges are a preset of their own


def test_an_older_configs_bash_network_keeps_its_meaning() -> None:
    assert AgentConfig.model_validate({"bash": {"network": True}}).egress.policy == "open"
    assert AgentConfig.model_validate({"bash": {"network": False}}).egress.policy == "off"
    # `network` written wins over it.
    assert AgentConfig.model_validate({"bash": {"network": True}, "network": "off"}).egress.policy == "off"


def test_the_short_forms_and_yamls_bare_off() -> None:
    for value, expected in (("off", "off"), (False, "off"), ("open", "open"), ("allow", "allow")):
        assert AgentConfig.model_validate({"network": value}).egress.policy == expected


@pytest.mark.parametrize(
    ("host", "port", "refused"),
    [
        ("github.com", 443, None),
        ("GitHub.COM.", 443, None),  # case and a trailing dot are the same host
        ("github.com", 80, None),
        ("github.com", 22, "network: port 22 of github.com is not in this channel's allow-list"),
        ("api.github.com", 443, NOT_LISTED.format("api.github.com")),  # an exact name covers no subdomain
        ("a.example.com", 443, None),
        ("deep.a.example.com", 443, None),
        ("example.com", 443, NOT_LISTED.format("example.com")),  # a wildcard covers subdomains only
        ("evilexample.com", 443, NOT_LISTED.format("evilexample.com")),
        ("example.com.evil.org", 443, NOT_LISTED.format("example.com.evil.org")),
        ("registry.internal", 8443, None),
        ("registry.internal", 443, "network: port 443 of registry.internal is not in this channel's allow-list"),
        ("192.0.2.10", 443, None),
        ("[2001:db8::1]", 443, None),
        ("2001:db8:0::1", 443, None),  # an address in another spelling
        ("bücher.example", 443, None),
        ("xn--bcher-kva.example", 443, None),
    ],
)
def test_hosts_wildcards_ports_and_addresses(host: str, port: int, refused: str | None) -> None:
    p = policy(
        {
            "allow": [
                "github.com",
                "*.example.com",
                "registry.internal:8443",
                "192.0.2.10",
                "[2001:db8::1]",
                "bücher.example",
            ]
        }
    )
    assert p.refusal(host, port) == refused


def test_off_refuses_everything_and_open_nothing() -> None:
    assert policy("off").refusal("pypi.org", 443) == "network: this channel's network is off"
    assert policy("open").refusal("anything.example", 22) is None


def test_presets_are_expanded_and_listed_by_name() -> None:
    assert {"registries", "forges"} <= set(presets())
    p = policy({"allow": ["forges"]})
    assert p.refusal("github.com", 443) is None and p.refusal("objects.githubusercontent.com", 443) is None
    assert p.refusal("pypi.org", 443) == NOT_LISTED.format("pypi.org")


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ("*", "for every host, `network: open`"),
        ("https://github.com", "a host, not a URL"),
        ("github.com/acme", "a host, not a URL"),
        ("user@github.com", "a host, not a URL"),
        ("regsitries", "unknown preset 'regsitries' (presets: registries, forges"),
        ("nexus", "a host of one label takes its port: nexus:443"),
        ("a.*.example.com", "a wildcard covers a domain's subdomains"),
        ("*example.com", "a wildcard covers a domain's subdomains"),
        ("*.com", "a wildcard covers a domain's subdomains"),
        ("github.com:0", "the port must be 1 to 65535"),
        ("github.com:99999", "the port must be 1 to 65535"),
        ("git hub.com", "expected a host name"),
        ("-bad-.example", "expected a host name"),
        ("-bad.example", "expected a host name"),
        ("bad-.example", "expected a host name"),
        ("", "expected a host name"),
        ("github.com:65536", "the port must be 1 to 65535"),
        (f"{'a' * 63}.{'b' * 63}.{'c' * 63}.{'d' * 62}", "expected a host name"),  # 254 characters: too long
    ],
)
def test_a_bad_allow_list_entry_is_refused_with_what_is_wrong(entry: str, said: str, tmp_path: Path) -> None:
    problem = refusal(tmp_path, f"network:\n  allow: [{entry!r}]\n")
    assert said in problem and "mm.yaml:2: network.allow" in problem, problem


def test_an_allow_list_entry_at_the_limits_is_taken() -> None:
    longest = f"{'a' * 63}.{'b' * 63}.{'c' * 63}.{'d' * 61}"  # 253 characters, as DNS allows
    p = policy({"allow": [longest, "x:443", "github.com:65535", "[::1]:8443"]})
    assert p.refusal(longest, 443) is None and p.refusal("github.com", 65535) is None
    assert p.refusal("x", 443) is None  # the shortest name: one letter (a host of the local network)
    assert p.refusal("::1", 8443) is None


def test_a_bad_entry_is_refused_with_the_forms_an_entry_may_take_and_the_presets() -> None:
    expected = f"expected a host name, *.domain, host:port, an address or a preset ({', '.join(presets())})"
    for entry, detail in [
        ("bad_host!", ""),
        ("git hub.com", ""),
        (443, ""),  # YAML reads a bare port as a number
        ("a*b.example", " (a wildcard covers a domain's subdomains: *.example.com)"),
    ]:
        with pytest.raises(ValueError) as e:
            expand([entry])  # type: ignore[list-item]
        assert str(e.value) == f"{expected}, got {entry!r}{detail}"


@pytest.mark.parametrize(
    ("network", "said"),
    [
        ("policy: closed", "network.policy: expected one of 'off', 'allow' or 'open'"),
        ("policy: off\n  credentials: [{hosts: [github.com], tokenEnv: T}]", "credentials need a network"),
        ("allow: [pypi.org]\n  credentials: [{hosts: [github.com], tokenEnv: T}]", "github.com, which `allow`"),
        ("allow: [github.com]\n  credentials: [{hosts: ['*.github.com'], tokenEnv: T}]", "exact host names"),
        ("allow: [github.com]\n  credentials: [{hosts: [github.com]}]", "tokenEnv"),
        ("allow: [github.com]\n  credentials: [{hosts: [github.com], tokenEnv: T, scheme: digest}]", "scheme"),
        ("allow: [github.com]\n  proxy: true", "proxy"),
        ("policy: open\n  credentials: [{hosts: [github.com], tokenEnv: T}]", "under `open` none runs"),
    ],
)
def test_a_bad_network_section_is_refused(network: str, said: str, tmp_path: Path) -> None:
    problem = refusal(tmp_path, f"network:\n  {network}\n")
    assert said in problem, problem


def refusal(tmp_path: Path, text: str) -> str:
    """What loading `text` as mm.yaml is refused with."""
    file = tmp_path / "mm.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(file, environ={})
    return str(e.value)


def test_credentials_become_the_header_of_their_scheme_and_a_missing_secret_says_which_variable() -> None:
    network = {
        "allow": ["github.com", "api.github.com", "registry.example.org"],
        "credentials": [
            {"hosts": ["api.github.com"], "tokenEnv": "GH"},
            {"hosts": ["github.com"], "tokenEnv": "GH", "scheme": "basic"},
            {"hosts": ["registry.example.org"], "tokenEnv": "REG", "scheme": "token"},
        ],
    }
    p = policy(network, {"GH": "ghs_secret"})
    assert p.header_for("api.github.com") == "Bearer ghs_secret"
    assert p.header_for("GitHub.com.") == "Basic " + base64.b64encode(b"x-access-token:ghs_secret").decode()
    assert p.header_for("registry.example.org") is None
    assert p.missing == {"registry.example.org": NO_SECRET.format(host="registry.example.org", env="REG")}
    assert p.credentialed == {"api.github.com", "github.com", "registry.example.org"}
    assert p.header_for("pypi.org") is None


def test_a_channels_or_a_jobs_network_replaces_the_top_level_one_whole(tmp_path: Path) -> None:
    file = tmp_path / "mm.yaml"
    file.write_text(
        "network: {allow: [registries, github.com]}\n"
        "channels:\n"
        "  C0123ABCD: {network: 'off'}\n"
        "  C0456EFGH: {network: {allow: [gitlab.com]}}\n"
        "jobs:\n"
        "  - {name: nightly, schedule: '0 3 * * *', channel: C0123ABCD, prompt: go, network: open}\n"
    )
    config = load_config(file, environ={})
    job = config.service.jobs[0]
    assert config.agent.egress.allow == ["registries", "github.com"]
    off, open_ = config.service.network_over("C0123ABCD", None), config.service.network_over("C0123ABCD", job)
    assert off is not None and off.policy == "off" and open_ is not None and open_.policy == "open"
    over = config.service.network_over("C0456EFGH", None)
    assert over is not None and over.allow == ["gitlab.com"]  # not merged with the top-level list
    assert config.service.network_over("C0999ZZZZ", None) is None  # the agent's own
    assert config.agent.with_network(over).egress.allow == ["gitlab.com"]


def test_mm_bot_inits_example_writes_allow_with_the_registries(tmp_path: Path) -> None:
    file = tmp_path / "mm.yaml"
    file.write_text(example_config())
    network = load_config(file, environ={}).agent.egress
    assert network.policy == "allow" and network.allow == ["registries"] and network.credentials == []


def test_the_metrics_count_by_host_and_give_at_most_a_bounded_number_of_hosts_a_label() -> None:
    def count(host: str, decision: str) -> float:
        return NETWORK_CONNECTIONS.labels(host, decision)._value.get()

    before = count("pypi.org", "allowed"), count("evil.example", "refused"), count("other", "refused")
    network_used(NetworkUsed("c1", (("pypi.org", 3),), (("evil.example", NOT_LISTED.format("evil.example")),)))
    assert count("pypi.org", "allowed") == before[0] + 3 and count("evil.example", "refused") == before[1] + 1
    # A command trying endless names: past NETWORK_HOST_LABELS hosts in this process, they share one label.
    names = [f"h{n}.flood.example" for n in range(NETWORK_HOST_LABELS + 5)]
    network_used(NetworkUsed("c2", (), tuple((name, "refused") for name in names)))
    labelled = {s.labels["host"] for m in NETWORK_CONNECTIONS.collect() for s in m.samples}
    assert len(labelled) <= NETWORK_HOST_LABELS + 1  # "other" besides
    assert count("other", "refused") >= before[2] + 5


def test_the_model_reads_ten_refusals_and_failures_and_a_count_of_the_rest(tmp_path: Path) -> None:
    tap = Tap(stop=lambda: None)
    for n in range(25):
        tap.refuse(f"h{n:02}.example", NOT_LISTED.format(f"h{n:02}.example"))
    tap.fail("gone.example", "network: host gone.example could not be resolved")
    tap.reach("pypi.org")
    events: list[object] = []
    ctx = ToolContext(workspace=tmp_path, config=AgentConfig(), call_id="c1", emit=events.append)
    out = bash_network_said("pip says no\n", cast(Any, SimpleNamespace(tap=tap)), ctx)
    lines = out.splitlines()
    assert lines[0] == "pip says no" and len(lines) == 12
    assert lines[1] == "network: host gone.example could not be resolved"  # by host name, failures with refusals
    assert lines[2] == NOT_LISTED.format("h00.example")
    assert lines[-1] == "network: and 16 more refused or failed connections to other hosts"
    [event] = events
    assert isinstance(event, NetworkUsed) and event.reached == (("pypi.org", 1),) and len(event.refused) == 25


def test_a_jobs_own_agent_that_says_off_keeps_it_and_the_top_level_off_yields_to_a_channel(tmp_path: Path) -> None:
    (tmp_path / "quiet.yaml").write_text("network: 'off'\n")
    (tmp_path / "mm.yaml").write_text(
        "network: 'off'\nmmConfigs: {quiet: {config: quiet.yaml}}\n"
        "channels: {C0123ABCD: {network: {allow: [pypi.org]}}}\n"
    )
    config = load_config(tmp_path / "mm.yaml", environ={})
    own = load_agent_file(config.agent.mmConfigs["quiet"])
    assert with_thread_network(config.service, own, "C0123ABCD", None, own_agent=True).egress.policy == "off"
    main = with_thread_network(config.service, config.agent.with_tool_call_cap(4), "C0123ABCD", None)
    assert main.egress.policy == "allow" and main.egress.allow == ["pypi.org"]
