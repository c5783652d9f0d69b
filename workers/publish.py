"""Task messages written straight into a Redis broker's queue, several in one command: the bot's hand-off.

Celery's `send_task` costs 0.45 ms of CPU a message on an idle core and over a millisecond beside the bot's
requests (bench/bench_inbound.py): its options, signals, producer and kombu's Redis client made anew for each
message, then one round trip each. On Redis, what reaches the broker is one LPUSH of a JSON envelope onto the
list named after the queue. `RedisPublisher` writes that envelope itself, for many messages in one LPUSH:
Celery still builds each message (`amqp.create_task_message`, its headers and body) and kombu still serializes
its body; only kombu's envelope, a few fields, is written here, and tests/test_hand_off.py holds it to what
Celery and kombu write for the same task, field for field, on a real Redis.

It is used only where it is the same thing: one plain `redis://` broker (no failover list) whose transport
options name no key prefix, messages neither compressed nor given a priority (a list of its own), and no trace
to carry (OpenTelemetry's Celery instrumentation works through `send_task`'s signals). Any other broker, or a
traced hand-off, goes through `send_task` as before (`for_app` says None).
"""

from __future__ import annotations

import base64
import functools
import uuid
from collections.abc import Sequence
from typing import Any

import redis
from kombu import serialization
from kombu.entity import maybe_delivery_mode
from kombu.utils.json import dumps

# A publish that cannot reach the broker gives up after this long: its sessions wait for housekeeping.
SOCKET_TIMEOUT_S = 5.0


class RedisPublisher:
    """Celery messages LPUSHed together, in one command."""

    def __init__(self, app: Any, url: str) -> None:
        self._app = app
        self._client = redis.Redis.from_url(
            url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S, health_check_interval=25
        )
        # Read from Celery's configuration once, not for every message (a sixteenth of the child's time).
        self._serializer = app.conf.task_serializer
        self._reply_to = app.thread_oid  # the child publishes from its one thread

    @classmethod
    def for_app(cls, app: Any) -> RedisPublisher | None:
        """A publisher for the app's broker when it is plain Redis with kombu's own key names; else None."""
        url = app.conf.broker_url or ""
        options = app.conf.broker_transport_options or {}
        plain = url.startswith("redis://") and ";" not in url  # not a list of brokers to fail over between
        kombus_own = options.get("global_keyprefix") or app.conf.task_compression or app.conf.task_default_priority
        if not plain or kombus_own:
            return None
        return cls(app, url)

    def publish(self, name: str, queue: str, calls: Sequence[list[Any]]) -> None:
        """One message of task `name` on `queue` for each list of arguments, in their order, in one round trip;
        redis.RedisError when the broker did not take them (all or none: one command; a connection lost after
        it was sent leaves that unknown, and housekeeping's enqueue of them again is harmless)."""
        if calls:
            # One LPUSH of several values pushes them one after the other: the list holds them as that many LPUSHes
            # would, and a worker's BRPOP takes the first one first.
            mode = self._delivery_mode(queue)
            self._client.lpush(queue, *(dumps(self.envelope(name, queue, mode, args)) for args in calls))

    def close(self) -> None:
        self._client.close()

    @functools.cache  # noqa: B019 - one publisher a process, and a queue or two
    def _delivery_mode(self, queue: str) -> int:
        """How Celery asks the broker to keep the queue's messages (2: on disk), as send_task_message decides it."""
        declared = self._app.amqp.queues[queue]
        return int(maybe_delivery_mode(declared.exchange.delivery_mode or self._app.conf.task_default_delivery_mode))

    def envelope(self, name: str, queue: str, mode: int, args: list[Any]) -> dict[str, Any]:
        """The JSON object kombu's Redis transport pushes for `app.send_task(name, args, queue=queue,
        ignore_result=True)`, with ids of its own."""
        task_id = str(uuid.uuid4())
        headers, properties, body, _ = self._app.amqp.create_task_message(
            task_id, name, args, {}, reply_to=self._reply_to, ignore_result=True
        )
        content_type, content_encoding, data = serialization.dumps(body, serializer=self._serializer)
        data = data.encode() if isinstance(data, str) else data
        return {
            "body": base64.b64encode(data).decode(),
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": headers,
            "properties": {
                **properties,
                "delivery_mode": mode,
                # Celery sends a direct queue's messages through the nameless exchange, routed by the queue's name.
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
