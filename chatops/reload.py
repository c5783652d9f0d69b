"""The config as its file says now, for a long-running process: read again when the file changes.

Every process (the bot, each worker, the scheduler) holds one `ConfigFile` and asks it for the config at the
start of each piece of work (an event, a turn, a tick), so an edit reaches all of them within a second of each
other: a job added by an edit is fired by the scheduler and found by the worker that runs it. A file that no
longer loads is reported once and the previous config kept: an edit with a typo never stops the service.

What a process built from the config at its start stays as it was until a restart: the database and broker
connections and the secrets (they come from the environment, which a running process cannot be given anew).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from chatops.config import Config, ConfigError, load_config

log = logging.getLogger("mm.config")

CHECK_S = 1.0  # how often the file's stamp is looked at, at most


class ConfigFile:
    def __init__(self, config: Config, check_s: float = CHECK_S) -> None:
        self._config, self._check_s = config, check_s
        self._stamp = _stamp(config.path)
        self._checked = time.monotonic()
        self._asked = False
        self._lock = threading.Lock()

    def current(self) -> Config:
        """The config, read again first when its file changed (or a reload was asked) since it was last read."""
        with self._lock:
            now = time.monotonic()
            if not self._asked and now - self._checked < self._check_s:
                return self._config
            self._checked = now
            stamp = _stamp(self._config.path)
            if not self._asked and stamp == self._stamp:
                return self._config
            self._asked, self._stamp = False, stamp
            try:
                config = load_config(self._config.path)
            except ConfigError as e:
                log.error("the config no longer loads; the previous one stays in use until it is fixed:\n%s", e)
                return self._config
            if config.database_url != self._config.database_url or config.broker_url != self._config.broker_url:
                log.warning("the database or broker URL changed: this process keeps its connections until a restart")
            self._config = config
            log.info("config reloaded from %s: %d job(s)", config.path, len(config.service.jobs))
            return config

    def ask(self) -> None:
        """Read the file again at the next `current()`, changed or not (SIGHUP)."""
        self._asked = True


def _stamp(path: Path | None) -> tuple[float, int] | None:
    try:
        info = path.stat() if path is not None else None
    except OSError:
        return None
    return (info.st_mtime, info.st_size) if info is not None else None
