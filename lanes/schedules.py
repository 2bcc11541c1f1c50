"""Scheduled audits: an agent's schedules, and how a firing is told from other requests.

A schedule lives in the agent's stream (`lanes.events.ScheduleChanged` in,
`lanes.events.ScheduleApplied` decided), so replay knows every schedule that was in force.
Each firing is an ordinary ``scheduled_audit`` request through the lanes, recorded as a
`lanes.events.RequestReceived` from the `SCHEDULER` principal with the dedupe key
``schedule:<id>:<fire time ms>`` (`firing_key`): folding it moves the schedule's
``last_fire`` on, so a restart never fires a time twice, and a redelivery is deduped anyway.
When a schedule fires (cron expressions, intervals, time zones) is the shell's business
(`gateway.runtime.schedules`); the lanes only record what fired.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from pydantic import Field, model_validator

from lanes.config import MAX_MS
from lanes.requests import AgentRequest, JsonObject, Kind, Priority, WireModel

SCHEDULER: Final = "scheduler"
"""The principal of every automatic firing."""
SCHEDULE_SOURCE: Final = "schedule"
"""The ``source`` of a firing (a manual "run now" has ``schedule:manual``)."""
MANUAL_SOURCE: Final = "schedule:manual"
FILE_PRINCIPAL: Final = "config"
"""The principal of what the config file defines."""
SCHEDULE_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
MAX_SCHEDULES: Final = 100
"""Schedules one agent may have."""
MIN_INTERVAL_MS: Final = 1_000
_KEY = re.compile(r"^schedule:([A-Za-z0-9][A-Za-z0-9_.\-]{0,63}):(\d{1,16})$")


class CatchUp(StrEnum):
    """What a schedule does about firings missed while no process ran it: skip them, or run
    once (for the latest missed time)."""

    SKIP = "skip"
    ONCE = "once"


class Schedule(WireModel):
    """When an agent gets a ``scheduled_audit``: a cron expression in a time zone, or a fixed
    interval (fire times are multiples of ``everyMs`` since the epoch)."""

    id: str = Field(pattern=SCHEDULE_ID_PATTERN)
    cron: str | None = Field(default=None, min_length=1, max_length=256)
    every_ms: int | None = Field(default=None, ge=MIN_INTERVAL_MS, le=MAX_MS)
    timezone: str = Field(default="UTC", min_length=1, max_length=64)
    payload: JsonObject = Field(default_factory=dict, validate_default=True)
    """Goes into each firing's payload (with ``schedule`` and ``fireAt`` added)."""
    priority: Priority = Priority.LOW
    paused: bool = False
    catch_up: CatchUp = CatchUp.SKIP

    @model_validator(mode="after")
    def _one_timing(self) -> Schedule:
        if (self.cron is None) == (self.every_ms is None):
            raise ValueError("a schedule needs exactly one of 'cron' and 'everyMs'")
        return self

    def timing(self) -> Schedule:
        """The schedule as it decides fire times: without ``paused`` (for comparing
        definitions: pausing is not a change of what was defined)."""
        return self.model_copy(update={"paused": False})


@dataclass(slots=True)
class ScheduleEntry:
    """A schedule in force for an agent, and how far it has fired."""

    schedule: Schedule
    since: int
    """When it was last defined (ms): it fires only after this."""
    last_fire: int | None = None
    """The latest fire time recorded for it."""
    fired: int = 0
    """Firings recorded."""
    from_file: bool = False
    """Defined by the config file (principal ``config``) at some time: a start whose file no
    longer has it removes it."""

    @property
    def fired_through(self) -> int:
        """Fire times up to here are done (fired, or before the schedule was defined)."""
        return self.since if self.last_fire is None else max(self.since, self.last_fire)


def firing_key(schedule_id: str, fire_ms: int) -> str:
    """The dedupe key of a schedule's firing at ``fire_ms``."""
    return f"{SCHEDULE_SOURCE}:{schedule_id}:{fire_ms}"


def firing_of(request: AgentRequest, principal: str | None) -> tuple[str, int] | None:
    """(schedule id, fire time) if the request is an automatic firing of a schedule."""
    if (principal != SCHEDULER or request.kind is not Kind.SCHEDULED_AUDIT
            or request.source != SCHEDULE_SOURCE or request.dedupe_key is None):
        return None
    match = _KEY.match(request.dedupe_key)
    if match is None:
        return None
    return match.group(1), int(match.group(2))
