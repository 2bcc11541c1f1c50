"""Every golden log of an earlier policy version verifies clean on today's code.

``tests/golden/*.jsonl.gz`` are `gateway export` files recorded by the gateway of their
time (tests/golden/README.md says which commit made which); each is imported into a new
log and verified with the CLI, as an operator would after an upgrade."""

from __future__ import annotations

import functools
import gzip
import importlib
import json
from pathlib import Path
from typing import cast

import pytest

from gateway.cli import main
from lanes.codec import decode
from lanes.gate import decode_gate_event, verify_gate
from lanes.gate.state import GateState
from lanes.policy import POLICY
from lanes.replay import Entry, verify
from lanes.state import AgentState
from lanes.streams import is_agent_stream

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
LOGS = sorted(GOLDEN.glob("*.jsonl.gz"))


def lines(path: Path) -> list[dict[str, object]]:
    """The events of an export, as JSON objects."""
    with gzip.open(path, "rt", encoding="utf-8") as source:
        return [json.loads(line) for line in source][1:]


def agent_log(events: list[dict[str, object]]) -> list[Entry]:
    return [Entry(int(str(e["position"])), str(e["stream"]),
                  decode(str(e["type"]), json.dumps(e["data"])))
            for e in events if is_agent_stream(str(e["stream"]))]


def gate_divergence(events: list[dict[str, object]]) -> object:
    gate = [decode_gate_event(str(e["type"]), json.dumps(e["data"]))
            for e in events if str(e["stream"]) == "provider:sim"]
    assert gate
    return verify_gate("provider:sim", gate)


@pytest.mark.parametrize("path", LOGS, ids=[p.name for p in LOGS])
def test_a_golden_log_imports_and_verifies_with_no_divergence(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "golden.db"
    assert main(["import", str(db), str(path)]) == 0
    capsys.readouterr()
    assert main(["verify", str(db)]) == 0
    assert "no divergence" in capsys.readouterr().out


def recorded_policy(events: list[dict[str, object]]) -> int:
    """The newest policy version a log's streams adopted (1: none adopted one)."""
    return max((int(str(cast(dict[str, object], e["data"])["version"])) for e in events
                if e["type"] == "PolicyAdopted"), default=1)


def test_every_policy_version_has_its_golden_log() -> None:
    """One ``policy-vN`` log per version, recorded under it; the other golden logs (of
    features added within a version, of scenarios) under a version this code knows."""
    versions = {path.name: recorded_policy(lines(path)) for path in LOGS}
    for version in range(1, POLICY + 1):
        assert versions.get(f"policy-v{version}.jsonl.gz") == version
    assert not {name for name in versions if name.startswith("policy-v")} - {
        f"policy-v{version}.jsonl.gz" for version in range(1, POLICY + 1)}
    assert set(versions.values()) == set(range(1, POLICY + 1))


def test_the_log_of_version_1_would_diverge_under_the_rules_of_version_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the versions are for: the calls and the gate's grants of a log recorded before
    2026-11-26 are not what today's rules would decide."""
    events = lines(GOLDEN / "policy-v1.jsonl.gz")
    assert verify(agent_log(events)) is None and gate_divergence(events) is None
    # Every stream as if it had adopted version 2 before its first event:
    monkeypatch.setattr(importlib.import_module("lanes.replay"), "AgentState",
                        functools.partial(AgentState, policy=2))
    monkeypatch.setattr(importlib.import_module("lanes.gate.replay"), "GateState",
                        functools.partial(GateState, policy=2))
    found = verify(agent_log(events))
    assert found is not None and type(found.redecided).__name__ == "CallBatchOpened"
    assert gate_divergence(events) is not None


def test_the_log_of_version_2_holds_its_versions_and_uses_its_rules() -> None:
    """Without its PolicyAdopted events (as version 1) it would diverge: it exercises the
    rules of version 2, in the agents' calls and at the gate."""
    events = lines(GOLDEN / "policy-v2.jsonl.gz")
    adopted = {str(e["stream"]) for e in events if e["type"] == "PolicyAdopted"}
    assert adopted == {str(e["stream"]) for e in events}
    unversioned = [e for e in events if not str(e["type"]).startswith("Policy")]
    found = verify(agent_log(unversioned))
    assert found is not None and type(found.recorded).__name__ == "CallBatchOpened"
    assert gate_divergence(unversioned) is not None


def test_an_export_to_a_gz_file_holds_the_same_lines_and_imports_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = GOLDEN / "policy-v2.jsonl.gz"
    db, again, out = tmp_path / "one.db", tmp_path / "two.db", tmp_path / "out.jsonl.gz"
    assert main(["import", str(db), str(path)]) == 0
    assert main(["export", str(db), "--out", str(out)]) == 0
    assert gzip.decompress(out.read_bytes()) == gzip.decompress(path.read_bytes())
    assert main(["import", str(again), str(out)]) == 0
    capsys.readouterr()
    (tmp_path / "bad.jsonl.gz").write_bytes(out.read_bytes()[:500])  # cut short
    assert main(["import", str(tmp_path / "three.db"), str(tmp_path / "bad.jsonl.gz")]) == 2
    assert "cannot read" in capsys.readouterr().err
