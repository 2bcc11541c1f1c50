"""The real gateway process, SIGKILLed 20 times under feed and control load (`bench.crash`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.crash import (
    CONFIG,
    CONTROL_TOKEN,
    FEED_TOKEN,
    ROOT,
    Ack,
    Ledger,
    Report,
    check,
    crash_run,
)
from lanes import Entry, Mode, parse_request
from lanes.events import RequestQueued, RequestReceived


@pytest.mark.slow
async def test_twenty_kill9_lose_nothing_acked_and_decide_nothing_twice(tmp_path: Path) -> None:
    report = await crash_run(tmp_path, kills=20, seed=20, min_load_ms=100, max_load_ms=600)
    assert report.problems == []
    assert report.kills == 20
    assert report.lost == 0 and report.duplicated == 0
    assert report.acked > 100, "the load never got going"
    assert report.repeated_acks > 0, "nothing was resubmitted across a kill"
    assert report.aborted_recorded == report.cut_off_runs > 0
    assert report.verify_exit == 0


def test_a_gateway_with_simulated_reasoners_does_not_import_the_llm_sdks(tmp_path: Path) -> None:
    # They take seconds to import, and a restart after a crash should not wait for them.
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG.format(db=tmp_path / "events.db", feed=FEED_TOKEN,
                                    control=CONTROL_TOKEN))
    probe = ("import sys; from gateway.config import load_config; "
             "from gateway.wiring import build_service; "
             f"build_service(load_config({str(config)!r})); "
             "print(sorted(m for m in ('anthropic', 'openai') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_the_check_counts_a_lost_ack_and_a_request_decided_twice() -> None:
    request = parse_request({"requestId": "r1", "createdAt": "2026-01-01T00:00:00+00:00",
                             "agentId": "btc", "kind": "hook_trigger", "dedupeKey": "k"})
    log = [Entry(1, "btc", RequestReceived(at=0, request=request)),
           Entry(2, "btc", RequestQueued(request_id="r1", mode=Mode.FOLLOWUP)),
           Entry(3, "btc", RequestReceived(at=1, request=request)),
           Entry(4, "btc", RequestQueued(request_id="r1", mode=Mode.FOLLOWUP))]
    report = Report()
    ledger = Ledger(report)
    ledger.acks = {"r1": Ack("accepted", 2, "btc"), "r2": Ack("accepted", 9, "btc")}
    check(log, ledger, set(), report)
    assert (report.lost, report.duplicated) == (1, 1)
