"""The demo runs its scenario end to end and its log verifies."""

from __future__ import annotations

from pathlib import Path

from gateway.cli import main
from gateway.tools.demo import run_demo


async def test_the_demo_scenario_runs_and_its_log_verifies(tmp_path: Path) -> None:
    lines: list[str] = []
    code = await run_demo(tmp_path / "demo.db", pace=0.05, out=lines.append)
    text = "\n".join(lines)
    assert code == 0, text
    assert "verify: clean" in text
    assert "emergency_stop: ACTIVE -> HALTED" in text
    assert "RunAborted" in text and "RequestDeduped" in text
    assert "schedule open-bell: 30 9 * * 1-5 (America/New_York) by demo" in text
    assert "scheduled_audit/low schedule:open-bell:manual:" in text


def test_replay_and_verify_commands_read_a_log(tmp_path: Path, capsys: object) -> None:
    import asyncio

    db = tmp_path / "demo.db"
    assert asyncio.run(run_demo(db, pace=0.05, out=lambda _: None)) == 0
    assert main(["verify", str(db)]) == 0
    assert main(["replay", str(db), "--agent", "agent_eth_1m"]) == 0
    assert main(["replay", str(db), "--agent", "nobody"]) == 2
    assert main(["verify", str(tmp_path / "missing.db")]) == 2
