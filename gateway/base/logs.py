"""The process's log lines: text (time, level, logger, message) or JSON (one object a line:
time, level, logger, message, and ``agentId``, ``requestId``, ``runId``, ``principal`` where
the record carries them), at a level chosen by the command line or the environment."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final, Literal

LogFormat = Literal["text", "json"]
LEVELS: Final = ("debug", "info", "warning", "error", "critical")
FORMATS: Final = ("text", "json")
CONTEXT: Final = {"agent_id": "agentId", "request_id": "requestId", "run_id": "runId",
                  "principal": "principal"}
"""Record attributes (``extra=``) copied into a JSON line, and their keys there."""
CHATTY: Final = ("httpx2", "httpcore2", "mcp", "alembic.runtime.plugins")
"""Libraries' loggers that say something at INFO for each request or session (an HTTP
call of a webhook, a peer or a provider SDK; an MCP session) or a dozen set-up lines at each
start: held at WARNING unless the level is ``debug``."""


class SettingError(ValueError):
    """A log setting that is not one of the allowed values (the message names its source)."""


class JsonLines(logging.Formatter):
    """One JSON object a line."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as JSON."""
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for attribute, key in CONTEXT.items():
            value = getattr(record, attribute, None)
            if value is not None:
                line[key] = value
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


TEXT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def chosen(flag: str | None, variable: str, allowed: tuple[str, ...], default: str,
           environ: Mapping[str, str] | None = None) -> str:
    """A setting: the command line's ``flag``, else the environment's ``variable``, else
    ``default``; `SettingError` naming where a value not ``allowed`` came from."""
    env = os.environ if environ is None else environ
    value, source = (flag, "the command line") if flag is not None else (
        env.get(variable), variable)
    if value is None or value == "":
        return default
    if value.lower() not in allowed:
        raise SettingError(f"{source}: log setting {value!r} is not one of "
                           f"{', '.join(allowed)}")
    return value.lower()


def configure(level: str = "warning", form: str = "text") -> None:
    """Send the process's log lines (uvicorn's too, see `gateway.edge.server`) to stderr at
    ``level``, as ``form``; the `CHATTY` libraries' at WARNING or above unless debugging."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLines() if form == "json" else logging.Formatter(TEXT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.NOTSET if level == "debug" else logging.WARNING)
