"""When a job fires, on both DST days of two zones: a skipped local time fires once at the end of the jump, a
repeated one fires once (the first time), and no day loses or doubles its run."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from chatops.schedule import fires, last_fire, next_fire


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def between(cron: str, zone: str, start: str, end: str) -> list[str]:
    return [f"{i:%m-%d %H:%M}" for i in fires(cron, zone, utc(start), utc(end))]


def test_a_daily_run_in_the_skipped_hour_runs_at_the_end_of_the_jump_once() -> None:
    # Europe/Paris, 2026-03-29: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that day.
    assert between("30 2 * * *", "Europe/Paris", "2026-03-27T00:00", "2026-03-31T00:00") == [
        "03-27 01:30",  # 02:30 CET
        "03-28 01:30",
        "03-29 01:00",  # 03:00 CEST: the first valid time after 02:30
        "03-30 00:30",  # 02:30 CEST
    ]


def test_every_quarter_of_a_skipped_hour_fires_once_at_its_end() -> None:
    assert between("*/15 2 * * *", "Europe/Paris", "2026-03-29T00:00", "2026-03-29T23:00") == ["03-29 01:00"]
    # And an hourly schedule keeps one run an hour: 02:00 and 03:00 local are the same instant that day.
    hourly = between("0 * * * *", "Europe/Paris", "2026-03-28T23:30", "2026-03-29T03:30")
    assert hourly == ["03-29 00:00", "03-29 01:00", "03-29 02:00", "03-29 03:00"]


def test_a_repeated_local_time_fires_once_the_first_time() -> None:
    # Europe/Paris, 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:30 happens twice (00:30Z and 01:30Z).
    assert between("30 2 * * *", "Europe/Paris", "2026-10-24T00:00", "2026-10-27T00:00") == [
        "10-24 00:30",
        "10-25 00:30",  # the first 02:30 only
        "10-26 01:30",  # 02:30 CET
    ]
    quarter = between("*/30 * * * *", "Europe/Paris", "2026-10-24T23:45", "2026-10-25T02:15")
    assert quarter == ["10-25 00:00", "10-25 00:30", "10-25 02:00"]  # 02:00 and 02:30 CET are repeats: not again


@pytest.mark.parametrize(
    ("zone", "change"),
    [
        ("America/New_York", "2026-03-08"),
        ("America/New_York", "2026-11-01"),
        ("Australia/Lord_Howe", "2026-10-04"),  # a half-hour change: 02:00 becomes 02:30
        ("Australia/Lord_Howe", "2026-04-05"),  # and 02:00 comes back to 01:30
    ],
)
@pytest.mark.parametrize("cron", ["30 2 * * *", "0 2 * * *", "15 1 * * *"])
def test_every_day_runs_exactly_once_across_a_change(zone: str, change: str, cron: str) -> None:
    middle = utc(f"{change}T12:00")
    runs = list(fires(cron, zone, middle - timedelta(days=4), middle + timedelta(days=4)))
    days = [r.astimezone(ZoneInfo(zone)).date() for r in runs]
    assert len(days) == len(set(days)), runs  # never twice a day
    assert [(b - a).days for a, b in itertools.pairwise(days)] == [1] * (len(days) - 1), runs  # nor a day lost
    assert len(days) >= 7


def test_next_and_last_fire_agree_and_default_to_utc() -> None:
    now = utc("2026-03-29T00:59:59")
    assert next_fire("30 2 * * *", "Europe/Paris", now) == utc("2026-03-29T01:00")
    assert last_fire("30 2 * * *", "Europe/Paris", utc("2026-03-29T01:00")) == utc("2026-03-29T01:00")  # at: included
    assert last_fire("30 2 * * *", "Europe/Paris", now) == utc("2026-03-28T01:30")
    assert next_fire("0 3 * * 1-5", "UTC", utc("2026-12-04T03:00")) == utc("2026-12-07T03:00")  # Friday → Monday
    assert last_fire("0 3 * * 1-5", "UTC", utc("2026-12-06T12:00")) == utc("2026-12-04T03:00")


def test_the_walk_from_the_asked_instant_agrees_with_a_walk_from_a_day_before_around_every_change() -> None:
    """next_fire starts its wall-clock walk at the asked instant's own wall time (chatops/schedule.py says why
    that is enough); a walk started a day earlier, which needs no such argument, must give the same answers,
    inside repeated and skipped hours too."""
    from datetime import timedelta
    from zoneinfo import ZoneInfo

    from croniter import croniter

    from chatops.schedule import instant_of

    def reference(cron: str, zone: str, after: datetime) -> datetime:
        tz = ZoneInfo(zone)
        walk = croniter(cron, (after.astimezone(tz) - timedelta(hours=26)).replace(tzinfo=None))
        while (instant := instant_of(walk.get_next(datetime), tz)) <= after:
            pass
        return instant

    changes = {  # a UTC instant inside each zone's change
        "Europe/Paris": ("2026-03-29T01:00", "2026-10-25T01:00"),
        "America/New_York": ("2026-03-08T07:00", "2026-11-01T06:00"),
        "Australia/Lord_Howe": ("2026-04-04T15:00", "2026-10-03T15:30"),  # half an hour, both ways
        "Pacific/Apia": ("2011-12-30T10:00",),  # the day Samoa skipped
    }
    crons = ("*/15 * * * *", "30 1 * * *", "45 2 * * *", "0 * * * *", "*/7 1-3 * * *")
    compared = 0
    for zone, instants in changes.items():
        for instant in instants:
            start = utc(instant) - timedelta(hours=3)
            for step in range(0, 6 * 60, 7):
                after = start + timedelta(minutes=step, seconds=step % 60)
                for cron in crons:
                    assert next_fire(cron, zone, after) == reference(cron, zone, after), (zone, cron, after)
                    compared += 1
    assert compared > 1500
