"""The process's log lines: the level and format from the command line or the environment,
text lines that carry the level, JSON lines with the record's context."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from gateway.base.logs import (
    CHATTY,
    FORMATS,
    LEVELS,
    JsonLines,
    SettingError,
    chosen,
    configure,
)


def test_the_command_line_wins_over_the_environment_and_a_bad_value_names_its_source() -> None:
    env = {"GATEWAY_LOG_LEVEL": "info"}
    assert chosen(None, "GATEWAY_LOG_LEVEL", LEVELS, "warning", env) == "info"
    assert chosen("DEBUG", "GATEWAY_LOG_LEVEL", LEVELS, "warning", env) == "debug"
    assert chosen(None, "GATEWAY_LOG_LEVEL", LEVELS, "warning", {}) == "warning"
    with pytest.raises(SettingError, match="GATEWAY_LOG_FORMAT: log setting 'xml'"):
        chosen(None, "GATEWAY_LOG_FORMAT", FORMATS, "text", {"GATEWAY_LOG_FORMAT": "xml"})
    with pytest.raises(SettingError, match="the command line: log setting 'loud'"):
        chosen("loud", "GATEWAY_LOG_LEVEL", LEVELS, "warning", env)


def test_a_json_line_has_time_level_logger_message_and_the_records_context() -> None:
    record = logging.LogRecord("gateway.runtime.engine", logging.WARNING, __file__, 1,
                               "run %s failed", ("r1",), None)
    record.agent_id, record.run_id = "desk", "desk-r1"
    line = json.loads(JsonLines().format(record))
    assert line["level"] == "warning" and line["logger"] == "gateway.runtime.engine"
    assert line["message"] == "run r1 failed"
    assert (line["agentId"], line["runId"]) == ("desk", "desk-r1")
    assert "requestId" not in line and line["time"].endswith("Z")


def test_configure_sends_lines_in_the_chosen_format_at_the_chosen_level(
        capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    chatty = {name: logging.getLogger(name).level for name in CHATTY}
    try:
        configure("info", "json")
        logging.getLogger("gateway.test").info("hello")
        logging.getLogger("gateway.test").debug("not shown")
        logging.getLogger("httpx2").info("HTTP Request: POST https://hooks.example/ 200")
        logging.getLogger("mcp.server.streamable_http_manager").info("Created new transport")
        configure("warning", "text")
        logging.getLogger("gateway.test").warning("careful")
        configure("debug", "text")  # (everything, libraries' requests too)
        assert logging.getLogger("httpx2").isEnabledFor(logging.DEBUG)
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        for name, was in chatty.items():
            logging.getLogger(name).setLevel(was)
    lines = capsys.readouterr().err.splitlines()
    assert json.loads(lines[0])["message"] == "hello" and len(lines) == 2
    assert " WARNING gateway.test careful" in lines[1]


def test_gateway_says_its_version_and_refuses_a_bad_log_format_naming_the_variable() -> None:
    version = subprocess.run([sys.executable, "-m", "gateway", "--version"],
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("gateway ")
    bad = subprocess.run([sys.executable, "-m", "gateway", "demo", "--log-format", "xml"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "the command line: log setting 'xml' is not one of text, json" in bad.stderr
