"""The roles a token can have (named by the config, enforced by the edge)."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """What a token may do. ``feed`` pushes market data and triggers; ``viewer`` only reads;
    ``control`` reads and acts on agents; ``admin`` also changes config; ``worker`` only does
    the runs of worker agents of its scope, on ``/ws/worker``."""

    FEED = "feed"
    CONTROL = "control"
    VIEWER = "viewer"
    ADMIN = "admin"
    WORKER = "worker"
