"""The agent's configuration: the reference's keys, with the reference's names.

The service (chatops.config) embeds this model at the top level of mm.yaml and adds its own keys; mm_core
only ever sees an AgentConfig. Unknown keys are errors everywhere: a typo must never be silently ignored.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from mm_core.errors import CoreError
from mm_core.network.policy import Mode, expand, normal_host, parse_rule

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: object) -> float:
    """Seconds from `30`, `30s`, `1.5m`, `500ms` or `2h` (Go-style durations, as the reference writes them)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m or 1h")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return float(m.group(1)) * _UNIT[m.group(2)]
    raise ValueError("expected a duration such as 30s, 5m or 1h")


Duration = Annotated[float, BeforeValidator(parse_duration)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class ModelPrice(Strict):
    """What the model's provider charges, per million tokens, in the team's currency: what money budgets count."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)


class ModelConfig(Strict):
    url: str = "http://localhost:12434/engines/v1"
    name: str = "ai/gemma3"
    apiKeyEnv: str | None = None
    temperature: float | None = None
    requestTimeout: Duration = 600.0
    # The model takes images (OpenAI-style `image_url` content parts): an image a person shares in a thread then
    # reaches it as one, besides being a file in the workspace. Off, it is only a file.
    vision: bool = False
    # The price per million tokens (None: unpriced): the service's money budgets count the cost of each answer.
    price: ModelPrice | None = None


class LspServer(Strict):
    command: str
    args: list[str] = Field(default_factory=list)
    extensions: list[str]


class LspConfig(Strict):
    servers: dict[str, LspServer] = Field(default_factory=dict)
    requestTimeout: Duration = 20.0
    maxServers: int = Field(default=8, ge=1)
    idleTimeout: Duration = 600.0


class AgentRef(Strict):
    config: str
    description: str | None = None
    yolo: bool | None = None


class Limits(Strict):
    """Resource limits for each bash command (setrlimit in the child)."""

    cpuSeconds: int | None = Field(default=60, ge=1)
    memoryMB: int | None = Field(default=2048, ge=16)
    processes: int | None = Field(default=256, ge=1)
    fileSizeMB: int | None = Field(default=512, ge=1)
    # The sandbox's /tmp and /var/tmp (tmpfs, each): at most this and memoryMB.
    tmpMB: int | None = Field(default=256, ge=1)
    # The workspace's size on disk, checked after each command (None: no bound).
    workspaceMB: int | None = Field(default=2048, ge=1)


class BashConfig(Strict):
    timeout: Duration = 30.0
    network: bool = True
    env: dict[str, str] = Field(default_factory=dict)
    passEnv: list[str] = Field(default_factory=list)
    limits: Limits = Field(default_factory=Limits)


class NetworkCredential(Strict):
    """A secret the proxy adds, outside the sandbox, to requests for `hosts` (exact names): `Authorization:
    Bearer <secret>`, `token <secret>`, or `Basic` of `username:<secret>` (git over HTTPS)."""

    hosts: list[str] = Field(min_length=1)
    tokenEnv: str = Field(min_length=1)
    scheme: Literal["bearer", "basic", "token"] = "bearer"
    username: str = "x-access-token"

    @field_validator("hosts")
    @classmethod
    def _exact_hosts(cls, value: list[str]) -> list[str]:
        for host in value:
            rule = parse_rule(host)
            if rule.suffix or rule.port is not None:
                raise ValueError(f"expected exact host names (no wildcard, no port), got {host!r}")
        return value


def _network_mode(value: Any) -> Any:
    """`network: off` (or allow, open) for `network: {policy: off}`; YAML reads a bare off as false."""
    if value is False:
        return {"policy": "off"}
    if isinstance(value, str):
        return {"policy": value}
    return value


class NetworkConfig(Strict):
    """Where sandboxed commands and fetch_content may connect (mm_core/network, docs/network.md)."""

    policy: Mode = "allow"
    # Hosts (`github.com`), wildcards (`*.example.com`), `host:port` (else 80 and 443) and presets by name.
    allow: list[str] = Field(default_factory=lambda: ["registries"])
    credentials: list[NetworkCredential] = Field(default_factory=list)

    @field_validator("policy", mode="before")
    @classmethod
    def _bare_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML reads `policy: off` as false

    @field_validator("allow")
    @classmethod
    def _entries(cls, value: list[str]) -> list[str]:
        expand(value)
        return value

    @model_validator(mode="after")
    def _credentials_reachable(self) -> NetworkConfig:
        if self.policy == "off" and self.credentials:
            raise ValueError("credentials need a network: `policy: off` reaches no host")
        if self.policy == "open" and self.credentials:
            raise ValueError("credentials are added by the proxy of `policy: allow`; under `open` none runs")
        rules = expand(self.allow)
        for credential in self.credentials:
            for host in credential.hosts:
                name = normal_host(host)
                if self.policy == "allow" and not any(rule.covers_host(name) for rule in rules):
                    raise ValueError(f"credentials for {name}, which `allow` does not list")
        return self


NetworkSetting = Annotated[NetworkConfig, BeforeValidator(_network_mode)]


class AcpConfig(Strict):
    """The reference's editor settings; only `title` matters here: it names an agent asked with ask_agent."""

    title: str | None = None


class AgentConfig(Strict):
    model: ModelConfig = Field(default_factory=ModelConfig)
    yolo: bool = True
    bashTool: bool = True
    editTools: bool = True
    skillsDir: str | None = None
    maxOutput: int = Field(default=20000, ge=100)
    previewLines: int = Field(default=10, ge=0)
    lsp: LspConfig = Field(default_factory=LspConfig)
    fetchContentTool: bool = False
    fetchAllow: list[str] = Field(default_factory=list)
    mmConfigs: dict[str, AgentRef] = Field(default_factory=dict)
    watchdogTimeout: Duration = 120.0
    maxTurns: int = Field(default=40, ge=1)
    # The most tool calls of one model answer that are carried out; the others are answered with an error, not
    # run (None: no bound, as in the reference). The worker sets it from worker.maxToolCallsPerAnswer.
    maxToolCallsPerAnswer: int | None = Field(default=None, ge=1)
    systemPrompt: str | None = None
    sandbox: Literal["auto", "bwrap", "none"] = "auto"
    bash: BashConfig = Field(default_factory=BashConfig)
    acp: AcpConfig = Field(default_factory=AcpConfig)
    # None in a file: `bash.network` when it is written (true: open, false: off), else allow-with-registries.
    network: NetworkSetting | None = None

    @model_validator(mode="after")
    def _egress(self) -> AgentConfig:
        """Fill `network` once, so that everything after reads one value."""
        if self.network is None:
            legacy = "network" in self.bash.model_fields_set
            policy = ("open" if self.bash.network else "off") if legacy else "allow"
            object.__setattr__(self, "network", NetworkConfig(policy=policy))
        return self

    @property
    def egress(self) -> NetworkConfig:
        """The network policy in force (`network`, filled at validation)."""
        assert self.network is not None
        return self.network

    def with_network(self, network: NetworkConfig | None) -> AgentConfig:
        """This config under a channel's or a job's own `network` (None: its own)."""
        return self if network is None else self.model_copy(update={"network": network})

    def with_tool_call_cap(self, cap: int | None) -> AgentConfig:
        """This config under a bound on the tool calls of one answer set from outside it (the worker's, or the
        asking agent's for an asked one): the smaller of that and its own wins, so neither can raise the other."""
        bounds = [n for n in (self.maxToolCallsPerAnswer, cap) if n is not None]
        effective = min(bounds) if bounds else None
        if effective == self.maxToolCallsPerAnswer:
            return self
        return self.model_copy(update={"maxToolCallsPerAnswer": effective})


def with_refs_from(config: AgentConfig, base: Path) -> AgentConfig:
    """`mmConfigs` paths made absolute against `base`, the directory of the file that names them.

    An asked agent's config is the operator's: read next to the config that names it, never from the
    workspace, where a command the model runs (or a commit) could rewrite it.
    """
    refs = {
        name: ref.model_copy(update={"config": str((base / ref.config).absolute())})
        for name, ref in config.mmConfigs.items()
    }
    return config.model_copy(update={"mmConfigs": refs})


# --- reading YAML, bounded ------------------------------------------------------------------------------------

# A config file is a few hundred nodes. The bounds stop an alias bomb (a few hundred bytes that expand to
# billions of nodes) and a nesting that would end in a RecursionError, with a line to point at.
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 100_000


class YamlProblem(CoreError, ValueError):
    """A YAML text that cannot be used; `line` is 1-based (0 when unknown)."""

    def __init__(self, line: int, problem: str):
        super().__init__(f"{line}: {problem}" if line else problem)
        self.line, self.problem = line, problem


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:  # pyright: ignore[reportIncompatibleMethodOverride]
        self.depth += 1
        try:
            if self.depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark
                raise YamlProblem(mark.line + 1, f"nested deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)  # pyright: ignore[reportArgumentType]
        finally:
            self.depth -= 1


def read_yaml(text: str) -> tuple[yaml.Node | None, Any]:
    """The document's node tree (it carries line numbers) and its data, or YamlProblem."""
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        if root is not None:
            _check_size(root)
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = " ".join(p for p in (e.context, e.problem) if p)
        raise YamlProblem(mark.line + 1 if mark else 0, f"invalid YAML: {problem}") from None
    except yaml.YAMLError as e:
        raise YamlProblem(0, f"invalid YAML: {e}") from None
    finally:
        loader.dispose()
    return root, data


def _check_size(root: yaml.Node) -> None:
    """Count the nodes as they would be once aliases are expanded, each shared node once per use."""
    sizes: dict[int, int] = {}
    busy: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in busy:
            raise YamlProblem(node.start_mark.line + 1, "an alias refers to a node that contains it")
        busy.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > MAX_YAML_NODES:
                raise YamlProblem(
                    node.start_mark.line + 1, f"expands to more than {MAX_YAML_NODES:,} values (aliases used too often)"
                )
        busy.discard(key)
        sizes[key] = total
        return total

    size(root)
