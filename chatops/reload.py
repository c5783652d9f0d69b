"""The config as its file says now, for a long-running process: read again when the file changes.

Every process (the bot, each worker, the scheduler) holds one `ConfigFile` and asks it for the config at the
start of each piece of work (an event, a turn, a tick), so an edit reaches all of them within a second of each
other: a job added by an edit is fired by the scheduler and found by the worker that runs it. A file that no
longer loads is reported once and the previous config kept: an edit with a typo never stops the service.

What a process built from its config at start stays as it was until a restart, and a reload keeps the
old values of (saying so): the database and broker URLs (its connections), the workspaces' root (running
threads' files are there), and the `worker` keys (the lease keeper's pace, the pool's size, housekeeping's
period). The environment (secrets, endpoints) is read at start only.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path

from chatops.config import Config, load_config

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
            self._asked = False
            try:
                config = load_config(self._config.path)
            except Exception as e:  # noqa: BLE001 - a bad edit (or one half written) never stops the service
                log.error("the config no longer loads; the previous one stays in use until it is fixed:\n%s", e)
                self._stamp = stamp
                return self._config
            if _stamp(self._config.path) != stamp:
                return self._config  # written to while it was read: read again at the next look, once it is whole
            self._stamp, self._config = stamp, _kept(self._config, config)
            log.info("config reloaded from %s: %d job(s)", config.path, len(config.service.jobs))
            return self._config

    def ask(self) -> None:
        """Read the file again at the next `current()`, changed or not (SIGHUP)."""
        self._asked = True


def _kept(old: Config, new: Config) -> Config:
    """`new`, with the values only a restart changes taken from `old` (said when they differ)."""
    changed = [
        name
        for name, differs in (
            ("the database URL", new.database_url != old.database_url),
            ("the broker URL", new.broker_url != old.broker_url),
            ("workspaces.root", new.workspaces_root != old.workspaces_root),
            ("worker", new.service.worker != old.service.worker),
        )
        if differs
    ]
    if changed:
        log.warning("%s changed: this process keeps the old value until it restarts", ", ".join(changed))
    service = new.service.model_copy(update={"worker": old.service.worker})
    return dataclasses.replace(
        new,
        database_url=old.database_url,
        broker_url=old.broker_url,
        workspaces_root=old.workspaces_root,
        service=service,
    )


def _stamp(path: Path | None) -> tuple[int, ...] | None:
    """What changes when the file does: a new inode (a ConfigMap's symlink swap, an editor's rename), times to
    the nanosecond, the inode's change time (also for a copy that kept the modification time), the size."""
    try:
        info = path.stat() if path is not None else None
    except OSError:
        return None
    if info is None:
        return None
    return (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns, info.st_size)
