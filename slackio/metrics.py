"""The service's metrics, in Prometheus' format: what an operator watches (docs/operations.md), and what bench/
measures.

Every process (`mm-bot serve`, `worker`, `beat`) serves its own on MM_METRICS_PORT when it is set, on
MM_METRICS_HOST (default loopback; the chart sets all addresses): a separate port, so /metrics never sits behind
the bot's public Ingress. A worker process holds all its turns' figures (the pool runs threads).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from chatops.schema import utcnow
from mm_core.events import Event, ModelCalled, NetworkUsed, ToolCallFinished, ToolCallStarted, TurnFinished
from slackio import traces

log = logging.getLogger("mm.metrics")

STEP_OUTSIDE_MODEL = Histogram(
    "mm_step_outside_model_seconds",
    "From a model answer's last byte to the next request's first: the loop, the tools' bookkeeping, the store, "
    "the rendering (the tool's own run time included only when a tool ran)",
    buckets=(0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0),
)
MODEL_SECONDS = Histogram("mm_model_call_seconds", "One model call, request to last byte")
TOKENS = Counter("mm_model_tokens_total", "Tokens used", ["kind"])
TURNS_STARTED = Counter("mm_turns_started_total", "Turns started: a message, a resume after a decision, a command")
TURNS_RUNNING = Gauge("mm_turns_running", "Turns this worker process runs now (what it holds, however busy the queue)")
TURNS = Counter(
    "mm_turns_finished_total",
    "Turns by how they ended: answered, suspended (waiting for a decision), max_turns, budget, cancelled, failed; "
    "crashed when the worker's own code failed",
    ["outcome"],
)
BUDGET_STOPS = Counter(
    "mm_budget_stops_total",
    "Turns a budget ended (chatops/budgets.py), by budget: turn_tokens, thread_tokens, turn_time, channel_day_tokens, "
    "thread_cost, channel_day_cost",
    ["budget"],
)
TOOL_SECONDS = Histogram(
    "mm_tool_call_seconds",
    "One tool call, from its start to its output (a call that waited for a decision counts from its resume)",
    ["tool", "status"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)
APPROVAL_WAIT = Histogram(
    "mm_approval_wait_seconds",
    "From a call's approval asked to its decision (approved, rejected, or expired)",
    ["decision"],
    buckets=(5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200),
)
APPROVAL_DECISIONS = Counter(
    "mm_approval_decisions_total",
    "Decisions on tool calls, by the approval policy rule that asked or refused ('none': the tool's own gating) "
    "and the decision: approved, rejected, expired, or denied (a deny rule refused it, nobody was asked)",
    ["rule", "decision"],
)
PENDING_APPROVALS = Gauge(
    "mm_approvals_pending",
    "Calls waiting for a decision, by how long they have waited (set by housekeeping)",
    ["age"],
)
# The ages mm_approvals_pending counts by: up to each bound, in seconds, and beyond the last.
PENDING_AGES = (("under_5m", 300.0), ("5m_to_30m", 1800.0), ("30m_to_2h", 7200.0), ("over_2h", None))
SLACK_ERRORS = Counter(
    "mm_slack_api_errors_total",
    "Slack Web API answers that were errors (ok: false, HTTP 5xx, a dropped connection), each attempt, by method "
    "and error",
    ["method", "error"],
)
NETWORK_CONNECTIONS = Counter(
    "mm_network_connections_total",
    "Sandboxed commands' connections through the egress proxy, by host and whether the policy let them through",
    ["host", "decision"],
)
# Hosts get a label of their own up to this many per process; beyond it they are counted as "other", so that a
# command trying endless names cannot grow the metrics without bound.
NETWORK_HOST_LABELS = 200
SLACK_RATE_LIMITED = Counter("mm_slack_rate_limited_total", "Slack's HTTP 429 answers, each one", ["method"])
TASK_SECONDS = Histogram(
    "mm_task_seconds",
    "One Celery task's run, by task and outcome (ok, failed)",
    ["task", "outcome"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0),
)


class StepClock:
    """One turn's figures: the gaps between its model calls, its tools' durations, how it ended."""

    def __init__(self) -> None:
        self._last_finished: float | None = None
        self._tools: dict[str, float] = {}

    def model_called(self, event: ModelCalled) -> None:
        # Each figure goes to its histogram and, when traces are on, to a span with the same two ends
        # (slackio.traces): the step spans and mm_step_outside_model_seconds agree to the nanosecond.
        if event.agent is None and self._last_finished is not None:
            STEP_OUTSIDE_MODEL.observe(max(0.0, event.started - self._last_finished))
            traces.interval("mm.step", self._last_finished, event.started)
        if event.agent is None:
            self._last_finished = event.finished
        MODEL_SECONDS.observe(max(0.0, event.finished - event.started))
        TOKENS.labels("prompt").inc(event.prompt_tokens)
        TOKENS.labels("completion").inc(event.completion_tokens)
        if traces.on():
            tokens = {"gen_ai.usage.input_tokens": event.prompt_tokens}
            tokens["gen_ai.usage.output_tokens"] = event.completion_tokens
            traces.interval("mm.model_call", event.started, event.finished, tokens | _agent(event.agent))

    def observe(self, event: Event) -> None:
        """Every event of the turn, as the worker's emit sees it."""
        if isinstance(event, ModelCalled):
            self.model_called(event)
        elif isinstance(event, ToolCallStarted):
            self._tools[event.call_id] = time.monotonic()
        elif isinstance(event, ToolCallFinished) and (began := self._tools.pop(event.call_id, None)) is not None:
            now, tool, status = time.monotonic(), _label(event.tool), str(event.status)
            TOOL_SECONDS.labels(tool, status).observe(now - began)
            if traces.on():
                attributes = {"mm.tool": tool, "mm.status": status} | _agent(event.agent)
                traces.interval("mm.tool_call", began, now, attributes)
        elif isinstance(event, TurnFinished):
            TURNS.labels(str(event.outcome)).inc()
        if isinstance(event, NetworkUsed):
            network_used(event)
        if isinstance(event, ToolCallFinished) and event.denied_by is not None:
            APPROVAL_DECISIONS.labels(rule_label(event.denied_by), "denied").inc()


def _agent(name: str | None) -> dict[str, str]:
    """An asked agent's span says whose it is (ask_agent); the main agent's says nothing."""
    return {"mm.agent": name} if name else {}


_LABEL = re.compile(r"[A-Za-z][A-Za-z0-9_.]{0,39}")


def _label(value: str) -> str:
    """A label value from outside (a tool's name from the model, Slack's error code): known shapes only, so a
    hostile value cannot grow the metrics without bound."""
    return value if _LABEL.fullmatch(value) else "other"


def rule_label(rule: str | None) -> str:
    """A rule's label as a metric's: the config names it (a bounded set), cut short; 'none' for no rule."""
    return (rule or "none")[:60]


_network_hosts: set[str] = set()


def network_host(host: str) -> str:
    """A host's label: itself while fewer than NETWORK_HOST_LABELS hosts have one, else "other"."""
    if host in _network_hosts:
        return host
    if len(_network_hosts) >= NETWORK_HOST_LABELS or len(host) > 253:
        return "other"
    _network_hosts.add(host)
    return host


def network_used(event: NetworkUsed) -> None:
    for host, count in event.reached:
        NETWORK_CONNECTIONS.labels(network_host(host), "allowed").inc(count)
    for host, _why in event.refused:
        NETWORK_CONNECTIONS.labels(network_host(host), "refused").inc()


def pending_ages(ages: dict[str, int]) -> None:
    """How many calls wait, by age (chatops.nudges.pending_by_age): every age set, those with none to 0."""
    for name, _ in PENDING_AGES:
        PENDING_APPROVALS.labels(name).set(ages.get(name, 0))


def waited(approval: Any, decision: str) -> None:
    """An approval decided (or expired) now: how long it waited (an ApprovalRow), and by which rule."""
    APPROVAL_DECISIONS.labels(rule_label(getattr(approval, "rule", None)), decision).inc()
    if approval.created_at is not None:
        APPROVAL_WAIT.labels(decision).observe(max(0.0, (utcnow() - approval.created_at).total_seconds()))


def slack_failed(method: str, error: str) -> None:
    SLACK_ERRORS.labels(_label(method), _label(error)).inc()


def slack_rate_limited(method: str) -> None:
    SLACK_RATE_LIMITED.labels(_label(method)).inc()


_served: list[int] = []  # the port this process serves on, once (a worker with an embedded beat asks twice)


def serve_metrics() -> bool:
    """Serve this process's metrics when MM_METRICS_PORT is set; whether this call started it. A port another
    process holds (`mm-bot dev` runs the bot and the worker on one machine) is said, not fatal."""
    port = os.environ.get("MM_METRICS_PORT")
    if not port or _served:
        return False
    host = os.environ.get("MM_METRICS_HOST", "127.0.0.1")
    try:
        start_http_server(int(port), addr=host)
    except (OSError, ValueError) as e:
        log.warning("metrics are not served: MM_METRICS_PORT=%s on %s: %s", port, host, e)
        return False
    _served.append(int(port))
    return True


class QueueDepth(Collector):
    """The turns waiting in the broker's queue, read at each scrape (what autoscaling follows too)."""

    def __init__(self, app: Any, queues: tuple[str, ...]) -> None:
        self.app, self.queues = app, queues

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # registering it must not ask the broker (the registry would call collect)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("mm_queue_depth", "Messages waiting in the broker's queue", labels=["queue"])
        try:
            with self.app.connection_for_read() as conn:
                channel = conn.default_channel
                for queue in self.queues:
                    # Declared as the workers declare it (idempotent; a passive declare fails on Redis, whose
                    # transport knows only the queues this connection declared).
                    depth = self.app.amqp.queues[queue].bind(channel).queue_declare().message_count
                    family.add_metric([queue], depth)
        except Exception as e:  # noqa: BLE001 - a broker that does not answer: no figure, said in the log
            log.warning("the queue depth could not be read: %s", e)
        yield family


def watch_queue(app: Any, queues: tuple[str, ...]) -> None:
    REGISTRY.register(QueueDepth(app, queues))
