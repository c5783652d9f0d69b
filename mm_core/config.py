"""The agent's configuration: the reference's keys, with the reference's names.

The service (chatops.config) embeds this model at the top level of mm.yaml and adds its own keys; mm_core
only ever sees an AgentConfig. Unknown keys are errors everywhere: a typo must never be silently ignored.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

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


class ModelConfig(Strict):
    url: str = "http://localhost:12434/engines/v1"
    name: str = "ai/gemma3"
    apiKeyEnv: str | None = None
    temperature: float | None = None
    requestTimeout: Duration = 600.0


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


class BashConfig(Strict):
    timeout: Duration = 30.0
    network: bool = True
    env: dict[str, str] = Field(default_factory=dict)
    passEnv: list[str] = Field(default_factory=list)
    limits: Limits = Field(default_factory=Limits)


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
    systemPrompt: str | None = None
    sandbox: Literal["auto", "bwrap", "none"] = "auto"
    bash: BashConfig = Field(default_factory=BashConfig)
    acp: AcpConfig = Field(default_factory=AcpConfig)
