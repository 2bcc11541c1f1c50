"""Golden logs recorded by the gateway replay and verify identically, forever."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.base.quarantine import PLAIN
from gateway.cli import main
from gateway.tools.transfer import parse
from lanes import replay, verify
from lanes.events import Event, RequestDropped, RequestRejected, RequestSummarized, RunsSuppressed
from lanes.replay import Entry
from tests.golden.record import SCENARIOS, expected_of, files, record, render

NAMES = [scenario.name for scenario in SCENARIOS]
decide_module = importlib.import_module("lanes.decide")  # the package exports the function


def golden(name: str) -> list[Entry]:
    """A golden log, decoded."""
    log, _ = files(name)
    return PLAIN.entries(parse(log.read_text(encoding="utf-8").splitlines()))


def imported(name: str, tmp_path: Path) -> Path:
    """A golden log imported into a new SQLite log with `gateway import`."""
    db = tmp_path / f"{name}.db"
    assert main(["import", str(db), str(files(name)[0])]) == 0
    return db


@pytest.mark.parametrize("name", NAMES)
def test_a_golden_log_replays_to_what_the_engine_held(name: str) -> None:
    expected = json.loads(files(name)[1].read_text())
    states = replay(golden(name))
    assert {agent: expected_of(state) for agent, state in states.items()} == expected["agents"]


@pytest.mark.parametrize("name", NAMES)
def test_a_golden_log_verifies_through_the_cli(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = imported(name, tmp_path)
    capsys.readouterr()
    assert main(["verify", str(db)]) == 0
    assert "no divergence" in capsys.readouterr().out


@pytest.mark.parametrize("name", NAMES)
def test_export_gives_back_the_imported_file_byte_for_byte(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = imported(name, tmp_path)
    out = tmp_path / "again.jsonl"
    assert main(["export", str(db), "--out", str(out)]) == 0
    assert out.read_bytes() == files(name)[0].read_bytes()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=NAMES)
async def test_recording_again_gives_the_same_files(scenario: Any) -> None:
    """The scenarios are repeatable; a difference means the gateway now decides or runs
    differently: re-record on purpose (`python -m tests.golden.record`) and review the diff."""
    log, expected = render(*await record(scenario))
    log_path, expected_path = files(scenario.name)
    assert expected == expected_path.read_text()
    assert log == log_path.read_text()


# -------------------------------------------------- a policy change found at its position


def first_position(log: list[Entry], test: Callable[[Event], bool]) -> int:
    return next(entry.position for entry in log if test(entry.event))


def test_verify_reports_where_a_changed_cap_policy_first_decides_otherwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lanes.rules import Victim

    log = golden("flood")
    # Today a full queue drops a pending request (or refuses one when all are high); the
    # changed policy always refuses the incoming one. The first cap decision that was not
    # "the incoming" is where the log stops meaning the same thing.
    expected = first_position(log, lambda e: (
        (isinstance(e, RequestDropped | RequestSummarized) and "a pending" in e.reason)
        or (isinstance(e, RequestRejected) and "queue full" in e.reason)))
    db = imported("flood", tmp_path)
    monkeypatch.setattr(decide_module, "cap_victim",
                        lambda pending, incoming, policy: Victim(None, incoming.priority))

    divergence = verify(log)
    assert divergence is not None and divergence.position == expected
    capsys.readouterr()
    assert main(["verify", str(db)]) == 1
    printed = capsys.readouterr().out
    assert f"DIVERGED at position {expected} in stream 'flood'" in printed
    assert "recorded" in printed and "re-decided" in printed


def test_verify_reports_where_a_changed_budget_rule_first_decides_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = golden("flood")
    expected = first_position(log, lambda e: isinstance(e, RunsSuppressed))
    monkeypatch.setattr(decide_module, "budget_block", lambda state: None)
    divergence = verify(log)
    assert divergence is not None
    assert divergence.position == expected
    assert isinstance(divergence.recorded, RunsSuppressed)
    assert divergence.input_position is not None and divergence.input_position < expected
