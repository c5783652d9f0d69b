"""Where a worker's CPU goes, per agent step: a py-spy recording of `bench_turns.py --py-spy FILE` (the stacks that
held the GIL, raw format) summed by what the time was spent on, in milliseconds per step (not a test).

Each sample is charged to the first part of the service or library found walking its stack from the innermost
frame out, so time spent in SQLAlchemy on behalf of the log's append counts as "database", and the agent loop's
own Python counts as "agent loop" only when nothing below it claims it.

    .venv/bin/python bench/bench_turns.py -n 200 -k 2 --py-spy var/worker.spy
    .venv/bin/python bench/profile_steps.py var/worker.spy --steps 600     # the steps the run made: N x (K+1)
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

# (what the time went to, a pattern matched against a frame: "function (path/file.py:line)" in py-spy's format)
PARTS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern.replace("@", r"(?:\(|/)")))  # "@": a path's start, as py-spy writes it or absolute
    for name, pattern in (
        ("database driver (psycopg)", r"@psycopg/"),
        ("database (SQLAlchemy: compiling, ORM, pool)", r"@sqlalchemy/"),
        ("model client (openai, httpx)", r"@openai/|@httpx2?/|@httpcore2?/|@h11/"),
        ("Slack client (slack_sdk)", r"@slack_sdk/"),
        ("HTTP client (aiohttp)", r"@aiohttp/|@yarl/|@multidict/"),
        ("TLS and sockets", r"@ssl\.py|@socket\.py|@selectors\.py"),
        ("JSON", r"@json/|orjson"),
        ("logging", r"@logging/"),
        ("metrics and traces", r"@prometheus_client/|@opentelemetry/"),
        ("Celery and kombu", r"@celery/|@kombu/|@billiard/|@amqp/|@redis/"),
        ("rendering into Slack (workers/render, slackio)", r"@workers/render\.py|@slackio/"),
        ("the session's store (chatops)", r"@chatops/"),
        ("tools", r"@mm_core/tools/"),
        ("loop detector and state", r"@mm_core/(loopdetect|state|log|display)\.py"),
        ("agent loop (mm_core/agent, model)", r"@mm_core/"),
        ("worker (workers/)", r"@workers/"),
        ("asyncio event loop", r"@asyncio/"),
        ("threads", r"@threading\.py|@concurrent/"),
    )
)
OTHER = "other"
NATIVE = "a thread holding the GIL with no Python frame (native code)"
LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")  # a stack, then its samples


def part_of(stack: str) -> str:
    if not stack.strip():
        return NATIVE
    frames = stack.split(";")
    for frame in reversed(frames):  # innermost first
        for name, pattern in PARTS:
            if pattern.search(frame):
                return name
    return OTHER


def summarize(path: Path) -> tuple[collections.Counter[str], int]:
    parts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        m = LINE.match(line)
        if m is None:
            continue
        count = int(m.group("count"))
        parts[part_of(m.group("stack"))] += count
        total += count
    return parts, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="py-spy raw recordings (one per worker process)")
    parser.add_argument("--steps", type=int, required=True, help="agent steps the run made (N sessions x (K+1))")
    parser.add_argument("--rate", type=int, default=100, help="py-spy's sampling rate (samples a second)")
    args = parser.parse_args()
    parts: collections.Counter[str] = collections.Counter()
    total = 0
    for f in args.files:
        p, t = summarize(f)
        parts.update(p)
        total += t
    if not total:
        print("no samples in the recordings", file=sys.stderr)
        return 1
    ms = 1000.0 / args.rate / args.steps
    print(f"{total} samples at {args.rate} Hz over {args.steps} steps: {total * ms:.1f} ms of GIL time per step")
    for name, count in parts.most_common():
        print(f"  {count * ms:7.2f} ms  {100 * count / total:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
