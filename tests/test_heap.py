"""What a long-running process loaded at start is out of every later collection (chatops.heap)."""

from __future__ import annotations

import gc

from chatops.heap import freeze_loaded


def test_what_a_process_loaded_is_out_of_every_later_collection() -> None:
    import bot.server  # noqa: F401 - what the bot loads before it serves
    import workers.celery_app  # noqa: F401 - and a worker

    tracked = len(gc.get_objects())
    try:
        frozen = freeze_loaded()
        # A full collection now walks what came after start-up, not what start-up loaded.
        assert frozen > 50_000, frozen
        assert len(gc.get_objects()) < tracked / 10, (len(gc.get_objects()), tracked)
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1, "what comes after the freeze is collected as before"
    finally:
        gc.unfreeze()
