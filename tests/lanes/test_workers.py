"""A run done by an external worker that was lost: aborted, its requests back at the head,
rerun at once only when another worker is there (both recorded in the input)."""

from __future__ import annotations

from lanes import AgentConfig, Mode, replay
from lanes.events import AbortReason, RunAborted, RunStarted, WorkerLost, WorkerReady
from tests.lanes.harness import Bench, types


def busy() -> Bench:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP))
    bench.send()
    assert bench.state.active is not None
    return bench


def test_a_lost_worker_aborts_the_run_and_reruns_it_on_the_next_worker() -> None:
    bench = busy()
    run_id = bench.run_id
    bench.send(priority="high")
    decisions = bench.feed(WorkerLost(at=bench.now, run_id=run_id, worker="w1", rerun=True))
    assert decisions[0] == RunAborted(run_id=run_id, reason=AbortReason.WORKER_LOST,
                                      requeued=True)
    assert isinstance(decisions[1], RunStarted) and decisions[1].request_ids == ("ar_1",)
    assert bench.pending_ids() == ["ar_2"]


def test_with_no_worker_left_the_requests_wait_at_the_head_until_one_is_ready() -> None:
    bench = busy()
    run_id = bench.run_id
    bench.send()
    decisions = bench.feed(WorkerLost(at=bench.now, run_id=run_id, worker="w1", rerun=False))
    assert types(decisions) == ["RunAborted"]
    assert bench.state.active is None and bench.pending_ids() == ["ar_1", "ar_2"]
    decisions = bench.feed(WorkerReady(at=bench.now, worker="w2"))
    assert isinstance(decisions[0], RunStarted) and decisions[0].request_ids == ("ar_1",)
    assert replay(bench.round_tripped())[bench.agent] == bench.state


def test_a_lost_worker_of_a_run_that_already_ended_decides_nothing() -> None:
    bench = busy()
    run_id = bench.run_id
    bench.finish()
    assert bench.feed(WorkerLost(at=bench.now, run_id=run_id, worker="w1", rerun=True)) == []
