"""Traces, with OpenTelemetry: off unless the standard OTEL_* variables ask for them.

On when OTEL_TRACES_EXPORTER names an exporter (`otlp`, or `console`), or when OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT says where to send them; OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none
keeps them off. Off, nothing of the SDK is imported and the spans below cost one test of a global. On, spans go
over OTLP/HTTP (protobuf), in batches from a thread of the SDK, to where the exporter's own variables say; the
Web API's and the model's HTTP calls (aiohttp) and the fetch tool's (httpx) are traced, and a caller adds its
own instrumentation (Celery's hand-off, the bot's server) once `configure` said yes.

A turn's own spans (`mm.step`, `mm.model_call`, `mm.tool_call`) are made from the very numbers the metrics
observe (slackio.metrics.StepClock): a step span lasts exactly what mm_step_outside_model_seconds recorded.
They are made once the interval is over, with its start and end, as children of whatever span is current then
(the Celery task's).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger("mm.traces")

# What OTEL_TRACES_EXPORTER may name here: the OTLP exporter this install carries (over HTTP), or the console.
EXPORTERS = ("otlp", "console")

_tracer: Any = None  # the SDK's tracer once configured; None means off
_lock = threading.Lock()


def asked(env: Mapping[str, str] | None = None) -> str | None:
    """The exporter the OTEL_* variables ask for (`otlp`, `console`), or None: traces stay off. A value this
    install cannot honour is said in the log, and leaves them off."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not exporter:
        endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        exporter = "otlp" if any(env.get(name, "").strip() for name in endpoints) else "none"
    if exporter == "none":
        return None
    if exporter not in EXPORTERS:
        log.warning("OTEL_TRACES_EXPORTER=%s: traces go to `otlp` or `console` only; traces are off", exporter)
        return None
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    if exporter == "otlp" and protocol.strip() not in ("", "http/protobuf"):
        log.warning(
            "OTEL_EXPORTER_OTLP_PROTOCOL=%s: traces are sent over http/protobuf only (a collector's port 4318); "
            "traces are off",
            protocol,
        )
        return None
    return exporter


def configure(service: str, env: Mapping[str, str] | None = None) -> bool:
    """This process's traces, when the OTEL_* variables ask for them: the SDK's provider and exporter, and the
    HTTP clients' instrumentation. `service` is the service's name unless OTEL_SERVICE_NAME gives one. True when
    traces are on (once configured, later calls say so and change nothing)."""
    global _tracer
    with _lock:
        if _tracer is not None:
            return True
        exporter = asked(env)
        if exporter is None:
            return False
        from opentelemetry import trace
        from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
        from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor, HTTPXClientInstrumentor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

        names = os.environ if env is None else env
        # Ours only as a default: OTEL_SERVICE_NAME (read by Resource.create) names it otherwise.
        resource = Resource.create({} if names.get("OTEL_SERVICE_NAME") else {"service.name": service})
        provider = TracerProvider(resource=resource)
        if exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            chosen: SpanExporter = OTLPSpanExporter()  # its endpoint, headers and timeout from OTEL_EXPORTER_OTLP_*
        else:
            chosen = ConsoleSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(chosen))
        trace.set_tracer_provider(provider)
        # The Web API's calls (slack_sdk's aiohttp sessions), the model's (mm_core.model's aiohttp session) and the
        # fetch tool's (httpx; httpx2 where a library of the process uses it).
        AioHttpClientInstrumentor().instrument()
        HTTPXClientInstrumentor().instrument()
        if importlib.util.find_spec("httpx2") is not None:
            HTTPX2ClientInstrumentor().instrument()
        _tracer = trace.get_tracer("mm")
        log.info("traces are on: %s, as service %s", exporter, resource.attributes.get("service.name"))
        return True


def on() -> bool:
    return _tracer is not None


def interval(name: str, started: float, finished: float, attributes: Mapping[str, Any] | None = None) -> None:
    """A span for an interval already over, from its two time.monotonic() readings: the same two numbers a
    metric observed, so the span's duration is the metric's value."""
    if _tracer is None:
        return
    # The wall clock's distance from the monotonic one, read once for both ends: the duration is kept exactly.
    offset = time.time_ns() - time.monotonic_ns()
    start = round(started * 1e9) + offset
    end = max(start, round(finished * 1e9) + offset)
    span = _tracer.start_span(name, start_time=start, attributes=dict(attributes or {}))
    span.end(end_time=end)


def carrier() -> dict[str, str] | None:
    """The current trace's context as the W3C headers carry it (`traceparent`, ...), for work that continues in
    another process (bot.hand_off); None when traces are off."""
    if _tracer is None:
        return None
    from opentelemetry import propagate

    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


@contextlib.contextmanager
def attached(headers: Any) -> Iterator[None]:
    """Within it, the trace whose context `headers` carries (what `carrier` gave in another process) is the
    current one; nothing when traces are off or `headers` are not a carrier's."""
    if _tracer is None or not isinstance(headers, dict):
        yield
        return
    from opentelemetry import context, propagate

    token = context.attach(propagate.extract({str(k): str(v) for k, v in headers.items()}))
    try:
        yield
    finally:
        context.detach(token)
