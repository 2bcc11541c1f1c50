"""Schema evolution: every event type has a version, and old versions are upcast on read.

An event's stored data says which version of its type's shape wrote it: data written at
version 1 carries no marker (so every log written before versions existed is version 1), and
data written at version N > 1 starts with ``{"_v":N``. Changing the shape of a type is done by
registering an `Upcaster` from its current version to the next; the type's version is then one
more than its newest upcaster, new data is written at that version, and old data is rewritten
step by step (1 -> 2 -> 3 ...) as a plain dict before it is validated into today's class. The
log itself is never rewritten.

An upcaster must be pure and total: it gets the JSON object of one event at ``from_version``
and returns the JSON object the next version would have written for the same fact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

VERSION_KEY = "_v"
"""The key that carries a version above 1 in an event's JSON object."""

JsonObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Upcaster:
    """Rewrites the data of one event type from ``from_version`` to ``from_version + 1``."""

    type: str
    from_version: int
    upcast: Callable[[JsonObject], JsonObject]


class UnknownEventVersion(ValueError):
    """The log holds an event version newer than this code knows: it was written by a newer
    gateway. Upgrade this one (nothing is ever downcast)."""


class Upcasters:
    """The upcasters of one family of event types, checked to form unbroken chains."""

    def __init__(self, upcasters: Iterable[Upcaster] = ()) -> None:
        chains: dict[str, dict[int, Callable[[JsonObject], JsonObject]]] = {}
        for item in upcasters:
            steps = chains.setdefault(item.type, {})
            if item.from_version in steps:
                raise ValueError(f"two upcasters of {item.type} from version {item.from_version}")
            steps[item.from_version] = item.upcast
        for type_name, steps in chains.items():
            if sorted(steps) != list(range(1, len(steps) + 1)):
                raise ValueError(
                    f"the upcasters of {type_name} must start at version 1 and leave no gap: "
                    f"{sorted(steps)}"
                )
        self._chains = chains
        self.versions: Mapping[str, int] = {
            type_name: len(steps) + 1 for type_name, steps in chains.items()
        }
        """The current version of every type that has changed shape (the others are at 1)."""

    def version(self, type_name: str) -> int:
        """The version new data of ``type_name`` is written at."""
        return self.versions.get(type_name, 1)

    def upcast(self, type_name: str, data: JsonObject) -> JsonObject:
        """Bring the JSON object of an event of ``type_name`` to its current version.

        The version marker is read and removed; missing means version 1.
        """
        version = data.pop(VERSION_KEY, 1)
        current = self.version(type_name)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"{type_name}: invalid event version {version!r}")
        if version > current:
            raise UnknownEventVersion(
                f"{type_name} version {version} was written by a newer gateway (this one knows "
                f"up to version {current}); upgrade it to read this log"
            )
        steps = self._chains.get(type_name, {})
        while version < current:
            data = steps[version](data)
            version += 1
        return data


AGENT_UPCASTERS: tuple[Upcaster, ...] = ()
"""Shape changes of agent events. None yet: every agent event type is at version 1.

To change a type's shape, change its class and add ``Upcaster("RunFinished", 1, fn)`` here,
where ``fn`` turns the old JSON object into the new one (``tests/replay/test_upcast.py`` shows
one end to end); then add a golden log written before the change (``tests/golden``).
"""
