"""What-if from here in its worker process, for a log only this process can read (in
memory: the worker is given the agent at the moment and the records after it), and one ask
at a time (another meanwhile is answered busy, nothing else is held)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.base.quarantine import PLAIN
from gateway.errors import Busy
from gateway.reads.replays import agent_replays
from gateway.reads.whatif import WhatIfs
from lanes import AgentConfig, Budgets
from tests.gateway.test_drill import traded_log
from tests.gateway.test_replays import stored


async def test_a_log_in_memory_is_given_to_the_worker_and_a_second_ask_is_busy() -> None:
    log, _ = traded_log()
    store = await stored(log)
    assert store.url is None
    replays = agent_replays()
    whatifs = WhatIfs()
    position = 3  # after the config: every request follows
    top = len(log)
    now = max(getattr(e.event, "at", 0) for e in log)
    config = AgentConfig(tools=("market_snapshot", "place_order"), cap=5,
                         budgets=Budgets(max_runs_per_hour=1))
    first = asyncio.create_task(whatifs.run(
        store, None, PLAIN, "alpha", position, position, top, config, now,
        lambda: replays.at(store, PLAIN, "alpha", position)))
    await asyncio.sleep(0)  # (the first has taken the worker)
    with pytest.raises(Busy):
        await WhatIfs().run(store, None, PLAIN, "alpha", position, position, top, config, now,
                            lambda: replays.at(store, PLAIN, "alpha", position))
    answer = await first
    rows = {r["measure"]: r for r in answer["rows"]}
    assert answer["events"] == top - position
    assert rows["requests received"]["recorded"] == rows["requests received"]["whatif"]
    assert rows["dropped"]["whatif"] > rows["dropped"]["recorded"]  # a cap of 5, not 50
    assert {"setting": "cap", "recorded": 50, "whatif": 5} in answer["changes"]
