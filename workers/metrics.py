"""The worker's metrics, in Prometheus' format: what an operator watches, and what bench/ measures.

`mm-bot worker` serves them on MM_METRICS_PORT when it is set (one endpoint per worker process: the pool runs
threads, so a process holds all its turns' figures).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from mm_core.events import ModelCalled

STEP_OUTSIDE_MODEL = Histogram(
    "mm_step_outside_model_seconds",
    "From a model answer's last byte to the next request's first: the loop, the tools' bookkeeping, the store, "
    "the rendering (the tool's own run time included only when a tool ran)",
    buckets=(0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0),
)
MODEL_SECONDS = Histogram("mm_model_call_seconds", "One model call, request to last byte")
TOKENS = Counter("mm_model_tokens_total", "Tokens used", ["kind"])
TURNS = Counter("mm_turns_total", "Turns by how they ended", ["outcome"])


class StepClock:
    """Times the gaps between one turn's model calls."""

    def __init__(self) -> None:
        self._last_finished: float | None = None

    def model_called(self, event: ModelCalled) -> None:
        if event.agent is None and self._last_finished is not None:
            STEP_OUTSIDE_MODEL.observe(max(0.0, event.started - self._last_finished))
        if event.agent is None:
            self._last_finished = event.finished
        MODEL_SECONDS.observe(max(0.0, event.finished - event.started))
        TOKENS.labels("prompt").inc(event.prompt_tokens)
        TOKENS.labels("completion").inc(event.completion_tokens)
