"""A scrape's per-agent series are bounded (`Service.metrics_max_agents`): the agents that
need attention first, then the deepest queues; every other agent summed under
``agent="_other"``, so that the sums over a family still give the desk's totals."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Awaitable, Callable

from gateway.base.clock import FakeClock
from gateway.edge.agent_series import FAMILIES, OTHER
from gateway.runtime.engine import Engine
from gateway.runtime.intake import take_all
from lanes import AgentConfig, Mode, status
from lanes.config import Budgets
from lanes.vocabulary import TradingState
from store import MemoryEventStore
from tests.e2e.live import running
from tests.gateway.support import ManualReasoner, control, request, until

CAP = 100
AGENTS = {f"agent{n:03}": AgentConfig(mode=Mode.FOLLOWUP, cap=50) for n in range(250)}
AGENTS["agent009"] = AgentConfig(mode=Mode.FOLLOWUP, cap=50,
                                 budgets=Budgets(max_runs_per_hour=1))
HALTED = ("agent003", "agent007")
SUPPRESSED = "agent009"
SAMPLE = re.compile(r'^(\w+)\{agent="([^"]+)"\} (\S+)$')


def depth_wanted(n: int) -> int:
    """Requests sent to the ``n``-th agent: a run, then 0 to 4 waiting (none to the agents
    stopped, so that only their attention shows them)."""
    return 1 + n % 5


async def test_a_scrape_shows_the_cap_attention_first_and_sums_the_rest() -> None:
    reasoner = ManualReasoner()
    clock = FakeClock()
    async with running(MemoryEventStore(), AGENTS, lambda _: reasoner, clock,
                       metrics_max_agents=CAP) as live:
        engine = live.engine
        await until(_started(engine), "the engine's start")
        # agent009 runs once, finishes, and is then suppressed by its hourly budget.
        await take_all(engine, [request(SUPPRESSED)])
        run_id = await until(_run_of(engine, reasoner, SUPPRESSED), "agent009's run")
        reasoner.finish(run_id)
        await until(_idle(engine, SUPPRESSED), "agent009's run to end")
        await take_all(engine, [request(SUPPRESSED)])
        await take_all(engine, [request(a) for n, a in enumerate(AGENTS)
                                if a not in {*HALTED, SUPPRESSED}
                                for _ in range(depth_wanted(n))])
        await take_all(engine, [control(a, "emergency_stop") for a in HALTED])
        async with live.client() as http:
            answer = await http.get("/metrics")
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        now = clock.now_ms()
        views = {a: status(engine.state(a), now) for a in AGENTS}
        pending = sum(len(engine.state(a).pending) for a in AGENTS)

    assert views[SUPPRESSED].suppressed_until is not None
    assert all(views[a].trading is TradingState.HALTED for a in HALTED)
    samples: dict[str, dict[str, float]] = defaultdict(dict)
    for line in answer.text.splitlines():
        match = SAMPLE.match(line)
        if match:
            name, agent, value = match.groups()
            assert agent not in samples[name], f"{agent} twice in {name}"
            samples[name][agent] = float(value)
    assert set(samples) == {f.name for f in FAMILIES}
    shown = set(samples["gateway_pending_requests"]) - {OTHER}
    assert len(shown) == CAP
    for fam in FAMILIES:  # every family: the same agents, and _other
        assert set(samples[fam.name]) == shown | {OTHER}, fam.name
    # The agents that need attention are shown though their queues are empty...
    assert {*HALTED, SUPPRESSED} <= shown
    assert all(views[a].pending == 0 for a in HALTED)
    # ... then the deepest queues: no agent left out waits deeper than one shown.
    hidden = set(AGENTS) - shown
    assert hidden
    assert min(views[a].pending for a in shown - {*HALTED, SUPPRESSED}) \
        >= max(views[a].pending for a in hidden)
    # A family's samples sum to the desk's total.
    for fam in FAMILIES:
        total = sum(fam.value(v) for v in views.values())
        assert math.isclose(sum(samples[fam.name].values()), total), fam.name
    assert sum(samples["gateway_pending_requests"].values()) \
        == pending > 0
    assert samples["gateway_halted"][OTHER] == 0 and sum(samples["gateway_halted"].values()) == 2
    assert samples["gateway_runs_total"][OTHER] \
        == sum(views[a].counters.runs for a in hidden) > 0


async def test_a_desk_within_the_cap_has_no_other() -> None:
    agents = dict(list(AGENTS.items())[:20])
    async with running(MemoryEventStore(), agents, lambda _: ManualReasoner(),
                       metrics_max_agents=20) as live, live.client() as http:
        text = (await http.get("/metrics")).text
    labels = {m.group(2) for m in map(SAMPLE.match, text.splitlines()) if m}
    assert labels == set(agents)


def _run_of(engine: Engine, reasoner: ManualReasoner, agent_id: str
            ) -> Callable[[], Awaitable[str | None]]:
    async def probe() -> str | None:
        active = engine.state(agent_id).active
        return active.run_id if active is not None and active.run_id in reasoner.results \
            else None
    return probe


def _started(engine: Engine) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return engine.running
    return probe


def _idle(engine: Engine, agent_id: str) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return engine.state(agent_id).active is None
    return probe


TYPE = re.compile(r"^# TYPE (\w+) (\w+)$")


async def test_a_scrape_names_each_family_once_and_counts_rather_than_computes_rates() -> None:
    agents = dict(list(AGENTS.items())[:5])
    async with running(MemoryEventStore(), agents, lambda _: ManualReasoner(),
                       metrics_max_agents=20) as live, live.client() as http:
        await until(_started(live.engine), "the engine's start")
        before = (await http.get("/metrics")).text
        await take_all(live.engine, [request(a) for a in agents])
        after = (await http.get("/metrics")).text
    kinds = [(m.group(1), m.group(2)) for m in map(TYPE.match, after.splitlines()) if m]
    names = [name for name, _ in kinds]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    # One family per meaning (gateway_runs_held said what gateway_held says), and rates are
    # Prometheus's to compute: a gauge of a rate over the process's own window says nothing
    # a scrape interval can check.
    assert "gateway_runs_held" not in names and "gateway_held" in names
    assert not [n for n in names if "rate" in n or n.endswith("per_second")], names
    # Each family's samples follow its own # TYPE line, in one block.
    families_seen = [_family_of(line, names) for line in after.splitlines()
                     if line and not line.startswith("#")]
    blocks = [f for i, f in enumerate(families_seen) if i == 0 or families_seen[i - 1] != f]
    assert len(blocks) == len(set(blocks)), "a family's samples are split"
    committed = _value(after, "gateway_log_committed_events_total")
    assert dict(kinds)["gateway_log_committed_events_total"] == "counter"
    assert dict(kinds)["gateway_log_writer_busy_seconds_total"] == "counter"
    assert committed >= _value(before, "gateway_log_committed_events_total") + len(agents)
    assert _value(after, "gateway_log_writer_busy_seconds_total") > 0


def _family_of(line: str, names: list[str]) -> str:
    name = re.split(r"[{ ]", line, maxsplit=1)[0]
    for suffix in ("_bucket", "_sum", "_count"):
        if name not in names and name.endswith(suffix):
            name = name.removesuffix(suffix)
    return name


def _value(text: str, name: str) -> float:
    [line] = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[1])
