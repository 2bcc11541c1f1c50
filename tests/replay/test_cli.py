"""The replay debugger from the command line: what a person types, what they read."""

from __future__ import annotations

import asyncio
import io
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.base.clock import FakeClock
from gateway.cli import main
from gateway.runtime.gate import ProviderGate
from gateway.tools.progress import Progress
from lanes.gate.events import CallOutcome, GateLimits
from lanes.streams import is_agent_stream
from store import RecordedEvent, SqliteEventStore
from tests.golden.record import files
from tests.replay.test_golden import imported

Capture = pytest.CaptureFixture[str]


@pytest.fixture
def desk(tmp_path: Path, capsys: Capture) -> Path:
    """The desk golden log in a SQLite file."""
    db = imported("desk", tmp_path)
    capsys.readouterr()
    return db


def run(capsys: Capture, *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``gateway argv`` (argparse's own errors exit)."""
    try:
        code = main(list(argv))
    except SystemExit as exited:
        code = int(exited.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ------------------------------------------------------------------------------ replay


def test_replay_prints_every_agent_in_tables(desk: Path, capsys: Capture) -> None:
    code, out, _ = run(capsys, "replay", str(desk))
    assert code == 0
    assert out.startswith("3 agents at position 155 of 155, recorded 2026-02-17 03:10:07")
    rows = [line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ("btc", "eth", "news")]
    assert [row[:3] for row in rows[:3]] == [
        ["btc", "ACTIVE", "collect"], ["eth", "ACTIVE", "followup"],
        ["news", "ACTIVE", "steer-backlog"]]
    assert "received" in out and "suppressions" in out
    assert out.rstrip().splitlines()[-1].startswith("replay: folded 155 events in ")


def test_replay_at_a_position_shows_the_agent_as_it_was_then(
    desk: Path, capsys: Capture
) -> None:
    code, out, _ = run(capsys, "replay", str(desk), "--agent", "eth", "--at", "63")
    assert code == 0
    assert out.startswith("eth at position 63 of 155")
    assert "active run: eth-r1" in out
    pending = [line.split()[1] for line in out.split("pending: 2")[1].splitlines()[3:5]]
    assert pending == ["rq12", "rq15"]
    assert "runs last hour" in out


def test_replay_at_a_time_stops_at_the_last_event_recorded_by_then(
    desk: Path, capsys: Capture
) -> None:
    moment = "2026-02-17T03:10:01.5Z"
    cutoff = int(datetime(2026, 2, 17, 3, 10, 1, 500_000, tzinfo=UTC).timestamp() * 1000)
    lines = files("desk")[0].read_text().splitlines()[1:]
    expected = max(json.loads(line)["position"] for line in lines
                   if json.loads(line)["recordedAt"] <= cutoff)
    code, out, _ = run(capsys, "replay", str(desk), "--at", moment)
    assert code == 0
    assert out.startswith(f"3 agents at position {expected} of 155")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--at", "yesterday"], "neither a log position"),
        (["--at", "156"], "--at 156: the log ends at position 155"),
        (["--agent", "doge"], "no agent 'doge'"),
    ],
)
def test_replay_refuses_bad_input_with_exit_code_2(
    desk: Path, capsys: Capture, argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, "replay", str(desk), *argv)
    assert (code, out) == (2, "")
    assert message in err


def test_an_unknown_agent_is_named_with_the_agents_there_are(
    desk: Path, capsys: Capture
) -> None:
    code, out, err = run(capsys, "replay", str(desk), "--agent", "doge")
    assert (code, out) == (2, "")
    assert "agents: btc, eth, news" in err


@pytest.mark.parametrize("command", ["replay", "timeline", "verify", "whatif", "export"])
def test_a_path_that_is_not_an_event_log_exits_2_and_is_left_alone(
    tmp_path: Path, capsys: Capture, command: str
) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a database, " * 100)
    extra = {"timeline": ["--agent", "a"], "whatif": ["--config", str(tmp_path / "x.toml")]}
    (tmp_path / "x.toml").write_text("[[agents]]\nid = 'a'\n")
    for path, message in [(text, "is not an event log"), (tmp_path / "gone.db", "no event log")]:
        code, out, err = run(capsys, command, str(path), *extra.get(command, []))
        assert (code, out) == (2, "") and message in err
    assert text.read_text() == "not a database, " * 100
    assert not (tmp_path / "gone.db").exists()


# ---------------------------------------------------------------------------- timeline


def test_timeline_shows_each_input_with_its_decisions_and_reasons(
    desk: Path, capsys: Capture
) -> None:
    code, out, _ = run(capsys, "timeline", str(desk), "--agent", "eth")
    assert code == 0
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == ["56"])
    assert "RequestReceived rq13 hook_trigger/normal" in lines[at]
    assert lines[at + 1].split(maxsplit=1) == [
        "57", "-> dropped rq11: cap 2 reached, policy old: dropped a pending low-priority request"]
    assert lines[at + 2].split(maxsplit=1) == ["58", "-> queued (followup)"]
    assert "-> suppressed: 2/2 runs this hour (runs resume 2026-02-17 04:10:01.000)" in out
    assert out.rstrip().endswith("22 inputs and 31 decisions of eth (53 events in its stream)")


def test_timeline_from_and_to_take_positions_or_times(desk: Path, capsys: Capture) -> None:
    code, out, _ = run(capsys, "timeline", str(desk), "--agent", "eth", "--from", "56",
                       "--to", "2026-02-17T03:10:01.6Z")
    assert code == 0
    inputs = [found.group(1) for line in out.splitlines()
              if (found := re.match(r" *(\d+)  2026-", line))]
    assert inputs == ["56", "59"]


# ------------------------------------------------------------------------------ verify


def test_verify_finds_a_tampered_decision_at_its_position(
    tmp_path: Path, capsys: Capture
) -> None:
    lines = files("desk")[0].read_text().splitlines()
    tampered = []
    for line in lines:
        event = json.loads(line)
        if event.get("position") == 58:  # eth: rq13 queued (followup)
            assert event["type"] == "RequestQueued"
            event["data"]["mode"] = "queue"
            line = json.dumps(event)
        tampered.append(line)
    source = tmp_path / "tampered.jsonl"
    source.write_text("\n".join(tampered) + "\n")
    db = tmp_path / "tampered.db"
    assert main(["import", str(db), str(source)]) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "verify", str(db))
    assert code == 1
    assert out.splitlines()[:4] == [
        "verify: DIVERGED at position 58 in stream 'eth'",
        "  input       @56      RequestReceived rq13 hook_trigger/normal cross:ETHUSD:3003",
        "  recorded    @58      RequestQueued: queued (queue)",
        "  re-decided           RequestQueued: queued (followup)",
    ]


def test_verify_ends_with_a_summary(desk: Path, capsys: Capture) -> None:
    code, out, err = run(capsys, "verify", str(desk))
    assert code == 0 and err == ""  # no progress bar when stderr is not a terminal
    assert out.startswith("verify: 155 agent events (69 inputs re-decided) and 0 provider "
                          "gate events (0 gates): no divergence; 155 events in ")


# ----------------------------------------------------------------------------- what-if


def test_whatif_reports_the_changes_per_agent(
    tmp_path: Path, capsys: Capture
) -> None:
    db = imported("flood", tmp_path)
    config = tmp_path / "wide.toml"
    config.write_text('[[agents]]\nid = "flood"\nmode = "followup"\ncap = 1000\n'
                      '[agents.budgets]\nmax_runs_per_hour = 5\n'
                      '[agents.reasoner]\nkind = "llm"\nprovider = "not-here"\n'
                      '[[agents]]\nid = "elsewhere"\n')
    capsys.readouterr()
    code, out, _ = run(capsys, "whatif", str(db), "--config", str(config))
    assert code == 0
    assert "flood: cap 10 -> 1000" in out
    rows = {line[:21].strip(): line[21:].split() for line in out.splitlines()
            if line.startswith("  ") and not line.startswith("  -")}
    assert rows["dropped"] == ["314", "0", "-314"]
    assert rows["rejected"] == ["63", "0", "-63"]
    assert rows["runs"] == ["5", "5", "-"]
    assert "not in the log (nothing to compare): elsewhere" in out


def test_whatif_refuses_a_bad_config_naming_the_key(tmp_path: Path, capsys: Capture) -> None:
    db = imported("flood", tmp_path)
    config = tmp_path / "bad.toml"
    config.write_text('[[agents]]\nid = "flood"\ncap = 0\n')
    capsys.readouterr()
    code, out, err = run(capsys, "whatif", str(db), "--config", str(config))
    assert (code, out) == (2, "")
    assert "agents[0].cap" in err


# ---------------------------------------------------------------------- export, import


async def gated_log(db: Path) -> None:
    """A log with a provider gate stream: limits applied, one slot granted and released."""
    clock = FakeClock()
    store = SqliteEventStore(db, clock=clock.now_ms)
    await store.open()
    gate = ProviderGate(store, "sim", GateLimits(requests_per_minute=5), clock)
    await gate.start()
    slot = await gate.acquire("a1", "a1-r1")
    gate.release(slot, CallOutcome.OK, input_tokens=10, output_tokens=5)
    await gate.stop()
    await store.close()


async def read_all(db: Path) -> list[RecordedEvent]:
    store = SqliteEventStore(db)
    await store.open()
    try:
        return await store.read()
    finally:
        await store.close()


def test_export_and_import_carry_provider_gate_streams(tmp_path: Path, capsys: Capture) -> None:
    source, copy, dump = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "a.jsonl"
    asyncio.run(gated_log(source))
    assert main(["export", str(source), "--out", str(dump)]) == 0
    assert main(["import", str(copy), str(dump)]) == 0
    capsys.readouterr()
    before, after = asyncio.run(read_all(source)), asyncio.run(read_all(copy))
    assert after == before
    assert {r.stream for r in after} == {"provider:sim"}
    assert not any(is_agent_stream(r.stream) for r in after)
    code, out, _ = run(capsys, "verify", str(copy))
    assert code == 0 and "provider gate events (1 gates): no divergence" in out


def test_export_to_stdout_is_the_log_alone(desk: Path, capsys: Capture) -> None:
    code, out, err = run(capsys, "export", str(desk))
    assert code == 0
    assert out == files("desk")[0].read_text()
    assert err.startswith("export: 155 events in")


def test_import_into_a_missing_directory_says_so(tmp_path: Path, capsys: Capture) -> None:
    code, _, err = run(capsys, "import", str(tmp_path / "no" / "x.db"), str(files("desk")[0]))
    assert code == 2 and "no directory" in err


def test_import_into_a_log_that_does_not_end_just_before_refuses(
    desk: Path, capsys: Capture
) -> None:
    code, _, err = run(capsys, "import", str(desk), str(files("desk")[0]))
    assert code == 2
    assert "not imported: event 'g-1' is at position 1, but the log continues at 156" in err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda lines: lines[:-1], "the header announces 155 events, the file holds 154"),
        (lambda lines: [*lines[:3], "{oops", *lines[4:]], "line 4: not JSON"),
        (lambda lines: [*lines[:3], lines[3].replace('"type":"', '"type":"X'), *lines[4:]],
         "line 4: unknown event type 'X"),
        (lambda lines: ["{}", *lines[1:]], "line 1: not a gateway-event-log export"),
        (lambda lines: [*lines[:13], lines[13].replace('"BTCUSD"}', 'Infinity}', 1), *lines[14:]],
         "line 14: data holds NaN or Infinity"),
    ],
    ids=["truncated", "not JSON", "unknown type", "no header", "Infinity"],
)
def test_import_checks_every_line_before_writing_anything(
    tmp_path: Path, capsys: Capture, change: object, message: str
) -> None:
    lines = files("desk")[0].read_text().splitlines()
    source = tmp_path / "bad.jsonl"
    source.write_text("\n".join(change(lines)) + "\n")  # type: ignore[operator]
    db = tmp_path / "new.db"
    code, _, err = run(capsys, "import", str(db), str(source))
    assert code == 2 and message in err
    assert not db.exists()


# ---------------------------------------------------------------------------- progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_draws_on_a_terminal_only() -> None:
    terminal, pipe = Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        with Progress("verify", 1_000, stream=stream) as bar:
            bar.advance(500)
        assert bar.done == 500 and bar.elapsed > 0
    assert "verify [##############..............]  50% 500/1,000 events" in terminal.getvalue()
    assert terminal.getvalue().endswith("\r\033[K")  # cleared at the end
    assert pipe.getvalue() == ""


@pytest.mark.slow
def test_verify_in_several_processes_finds_the_same_divergence(
    tmp_path: Path, capsys: Capture
) -> None:
    lines = files("desk")[0].read_text().splitlines()
    lines[58] = lines[58].replace('"mode":"followup"', '"mode":"queue"')  # position 58
    source, db = tmp_path / "tampered.jsonl", tmp_path / "tampered.db"
    source.write_text("\n".join(lines) + "\n")
    assert main(["import", str(db), str(source)]) == 0
    capsys.readouterr()
    in_order = run(capsys, "verify", str(db), "--jobs", "1")
    side_by_side = run(capsys, "verify", str(db), "--jobs", "2")
    assert in_order == side_by_side
    assert in_order[0] == 1 and "DIVERGED at position 58" in in_order[1]
    clean = imported("desk", tmp_path)
    capsys.readouterr()
    code, out, _ = run(capsys, "verify", str(clean), "--jobs", "2")
    assert code == 0 and out.rstrip().endswith("in 2 processes")
