"""Traces (slackio.traces), on real parts: the real bot (`mm-bot serve`) and a real `celery worker` export to an
OTLP/HTTP collector of the test's own (mm_testkit.otlp_collector) when the standard OTEL_* variables say so; one
trace goes from the Slack request to the turn's Web API calls, and its step spans last what the step metric
recorded. Without the variables, nothing of the SDK is loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from mm_testkit.otlp_collector import OtlpCollector, ReceivedSpan
from mm_testkit.redis_server import OwnRedis
from mmbot_helpers import free_port
from playground.signed import SlackEventSender
from slackio.traces import asked
from threads_support import CHANNEL, SECRET, Stack, stack

# Its tests start processes (mm_testkit/process_guard.py): the bot, a worker, a probe of the set-up.
pytestmark = [pytest.mark.timeout(240), pytest.mark.process]


@pytest.fixture
def traced(tmp_path: Path, fresh_pg_url: str) -> Iterator[tuple[Stack, OtlpCollector]]:
    server = OwnRedis(tmp_path / "redis")
    server.start()
    try:
        with OtlpCollector() as collector, stack(tmp_path, fresh_pg_url, server.url) as s:
            # The standard variables only: where the collector is, and short batches so the test waits little.
            s.extra_env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.base, "OTEL_BSP_SCHEDULE_DELAY": "100"}
            yield s, collector
    finally:
        server.stop()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def sample(text: str, name: str) -> float:
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head == name:
            return float(value)
    raise AssertionError(f"{name} is not in the metrics")


def url_of(span: ReceivedSpan) -> str:
    return str(span.attributes.get("url.full") or span.attributes.get("http.url") or "")


def test_one_trace_from_the_slack_request_to_the_turn_and_its_steps_agree_with_the_metric(
    traced: tuple[Stack, OtlpCollector],
) -> None:
    s, collector = traced
    metrics_port = free_port()
    s.extra_env["MM_METRICS_PORT"] = str(metrics_port)
    s.start_worker(beat=False)
    del s.extra_env["MM_METRICS_PORT"]  # the bot serves none (the worker's port is taken)
    base = s.start_bot()
    with SlackEventSender(base, SECRET, bot_user_id=s.slack.bot_user_id) as sender:
        mention = f"<@{s.slack.bot_user_id}> run: echo traced"
        response = sender.app_mention(mention, channel=CHANNEL, user="U0ALICE", event_id="Ev0TRACED")
        assert response.status_code == 200
        root = sender.last_payload["event"]["ts"]
    s.wait(lambda: "done: traced" in s.thread_text(root), message="the answer in the thread")

    def requests() -> list[ReceivedSpan]:
        return [x for x in collector.spans if x.kind == "server" and "/slack/events" in x.name]

    request = s.wait(requests, message="the Slack request's span")[0]
    assert request.service == "mm-bot"

    def in_trace() -> list[ReceivedSpan]:
        spans = [x for x in collector.spans if x.trace_id == request.trace_id]
        # The task's span ends after the turn has said everything: then the trace is whole.
        return spans if any(x.name == "run/mm.run_session" for x in spans) else []

    trace = s.wait(in_trace, message="the worker's task span in the request's trace")
    names = [x.name for x in trace]
    publish = [x for x in trace if x.name == "apply_async/mm.run_session"]
    run = [x for x in trace if x.name == "run/mm.run_session"]
    assert len(publish) == 1 and publish[0].kind == "producer" and publish[0].service == "mm-bot", names
    assert len(run) == 1 and run[0].kind == "consumer" and run[0].service == "mm-worker", names
    assert run[0].parent_id == publish[0].span_id  # the context travelled in the task message's headers
    steps = [x for x in trace if x.name == "mm.step"]
    model_calls = [x for x in trace if x.name == "mm.model_call"]
    tools = [x for x in trace if x.name == "mm.tool_call"]
    assert len(steps) == 1 and len(model_calls) == 2, names  # a tool call, then the answer
    assert tools and tools[0].attributes["mm.tool"] == "bash" and tools[0].attributes["mm.status"] == "ok"
    assert all(x.parent_id == run[0].span_id for x in steps + model_calls + tools)
    assert model_calls[0].attributes["gen_ai.usage.input_tokens"] > 0
    # The HTTP calls themselves: the model's (httpx) and the Web API's (aiohttp), from the worker.
    model_http = [x for x in trace if x.kind == "client" and url_of(x).startswith(s.model.url.rstrip("/"))]
    slack_http = [x for x in trace if x.kind == "client" and url_of(x).startswith(s.slack.url.rstrip("/"))]
    assert len(model_http) >= 2, names
    assert {x.service for x in slack_http} == {"mm-worker"}, names
    assert any("chat." in url_of(x) for x in slack_http), [url_of(x) for x in slack_http]
    # A step starts when the first answer's last byte is in and ends when the next request's first leaves (the
    # same monotonic readings; each span reads the wall clock's offset once, a few microseconds apart).
    assert abs(model_calls[0].end_ns - steps[0].start_ns) < 100_000
    assert abs(steps[0].end_ns - model_calls[1].start_ns) < 100_000

    # The step metric observed the very same interval.
    text = scrape(metrics_port)
    assert sample(text, "mm_step_outside_model_seconds_count") == len(steps)
    assert sample(text, "mm_step_outside_model_seconds_sum") == pytest.approx(steps[0].seconds, abs=2e-9)
    assert sample(text, "mm_model_call_seconds_sum") == pytest.approx(sum(x.seconds for x in model_calls), abs=4e-9)


OFF_PROBE = """
import json, sys, threading
from workers.celery_app import traced
on = traced("mm-worker")
from opentelemetry import trace
print(json.dumps({
    "on": on,
    "provider": type(trace.get_tracer_provider()).__name__,
    "sdk": sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.instrumentation"))),
    "threads": [t.name for t in threading.enumerate()],
}))
"""


def probe(env: dict[str, str]) -> dict:
    """What a process that sets up traces as the worker does ends with, under `env` and no other OTEL_*."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | env
    done = subprocess.run([sys.executable, "-c", OFF_PROBE], env=clean, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]) | {"stderr": done.stderr}


def test_without_otel_variables_nothing_is_configured_nor_loaded() -> None:
    off = probe({})
    assert off["on"] is False
    assert off["provider"] == "ProxyTracerProvider"  # the API's default: no provider was set
    assert off["sdk"] == [] and off["threads"] == ["MainThread"]  # no SDK, no instrumentation, no exporter thread
    on = probe({"OTEL_TRACES_EXPORTER": "console"})
    assert on["on"] is True and on["provider"] == "TracerProvider" and len(on["threads"]) > 1


@pytest.mark.parametrize(
    ("env", "exporter"),
    [
        ({}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, None),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, None),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, None),
    ],
)
def test_the_standard_variables_decide(env: dict[str, str], exporter: str | None) -> None:
    assert asked(env) == exporter


def test_a_value_this_install_cannot_honour_is_said(caplog: pytest.LogCaptureFixture) -> None:
    assert asked({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) is None
    assert "sent over http/protobuf only" in caplog.text and "traces are off" in caplog.text
