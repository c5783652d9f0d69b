"""When a job fires: a 5-field cron expression read on a time zone's wall clock, turned into UTC instants.

Cron speaks wall-clock time, and twice a year a zone's wall clock skips an hour or repeats one. The rules, as
people who schedule chores expect them:

- a local time that does not exist (the clocks jumped over it) fires at the first valid time after it, the end
  of the jump; several such times (every quarter of an hour in a skipped hour) fire once there;
- a local time that happens twice (the clocks went back) fires once, the first time.

So a DST change never runs a job twice and never skips it. Every instant here is an aware UTC datetime.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter

# Zones move their clocks back by at most a day (Samoa, 2011): last_fire's backward walk starts this far ahead.
_MARGIN = timedelta(hours=26)


def fires(cron: str, zone: str, after: datetime, until: datetime) -> Iterator[datetime]:
    """The instants the schedule fires strictly after `after` and up to `until` included, in order."""
    for instant in _walk(cron, ZoneInfo(zone), after):
        if instant > until:
            return
        yield instant


def next_fire(cron: str, zone: str, after: datetime) -> datetime:
    """The first instant the schedule fires strictly after `after`."""
    return next(_walk(cron, ZoneInfo(zone), after))


def last_fire(cron: str, zone: str, at: datetime) -> datetime:
    """The last instant the schedule fired at or before `at`."""
    tz = ZoneInfo(zone)
    walk = croniter(cron, (at.astimezone(tz) + _MARGIN).replace(tzinfo=None))
    while True:
        instant = instant_of(walk.get_prev(datetime), tz)
        if instant <= at:
            # The wall time before it may map to the same instant (both in a skipped hour): still this one.
            return instant


def instant_of(wall: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant of a naive wall-clock time in `tz`: the first of a repeated time, the end of the jump for
    a time that does not exist."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return first
    # Skipped: zoneinfo read it with the offset before the jump, which lands after it. The end of the jump is the
    # earliest instant whose wall time is at or after `wall`; it lies between the two readings of `wall`.
    low = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    low, high = min(low, first), max(low, first)
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(tz).replace(tzinfo=None) >= wall:
            high = middle
        else:
            low = middle
    return high.replace(microsecond=0)


def _walk(cron: str, tz: ZoneInfo, after: datetime) -> Iterator[datetime]:
    # instant_of is the earliest instant whose wall time is at or after the given one, so it never decreases as
    # the wall time grows, and no wall time before `after`'s own maps after `after`: the walk starts there.
    walk = croniter(cron, after.astimezone(tz).replace(tzinfo=None))
    last = after
    while True:
        instant = instant_of(walk.get_next(datetime), tz)
        if instant > last:  # several skipped wall times share the end of their jump: it fires once
            yield instant
            last = instant
