"""A port for a server a test (or a benchmark) starts."""

from __future__ import annotations

import random
import socket


def free_port() -> int:
    """A port free now for a server a test starts, from below the kernel's ephemeral range: a port the kernel
    handed out (bind to 0) is the kind it also gives the next outgoing connection (git, a client of the
    emulators), which may take it before the server binds it."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a crowded machine: the kernel's choice, as before
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
