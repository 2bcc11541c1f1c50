"""An agent's runs: started as tasks after their start is committed, stopped early.

A run starts only once the `RunStarted` that decides it is committed (*start late*), and is
cancelled as soon as its abort is decided (*stop early*: never wait to stop trading). Its
result comes back into the agent's stream as an input (`RunFinished`, `RunErrored`,
`SpendLimitHit`), so replay knows what it came to; a steer decided for it is handed to it at
once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from gateway.base.clock import Clock
from gateway.base.metrics import DURATION_BUCKETS, Histogram
from gateway.errors import Unstorable
from gateway.llm.reasoner import Reasoner, RunContext, RunResult, SpendLimitError
from gateway.runtime.agents import Agent
from gateway.runtime.core import Outcome
from gateway.runtime.gate import SlotGate
from gateway.runtime.toolbox import RunGone, RunTools, Toolbox
from gateway.runtime.workers import WorkerLostError
from lanes.events import (
    Decision,
    Input,
    RunErrored,
    RunFinished,
    RunStarted,
    RunSteerability,
    RunSteered,
    SpendLimitHit,
    TasksFinished,
    WorkerLost,
)
from lanes.state import ActiveRun

log = logging.getLogger("gateway.runtime.engine")


class Runs:
    """Every agent's run task: started, steered, cancelled, its result fed back.

    ``feed`` gives an input to a live agent (the engine's); ``live`` says whether an agent
    still decides here; ``spawn`` starts a task the engine cancels at its stop."""

    def __init__(self, *, clock: Clock, reasoners: Callable[[str], Reasoner],
                 gate_of: Callable[[str], SlotGate | None],
                 feed: Callable[[Agent, Input], Outcome[Decision]],
                 live: Callable[[Agent], bool],
                 spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]],
                 toolbox: Toolbox) -> None:
        self._clock = clock
        self.toolbox = toolbox
        """What the runs' read tools read (`gateway.runtime.toolbox`)."""
        self._reasoners = reasoners
        self._gate_of = gate_of
        self._feed = feed
        self._live = live
        self._spawn = spawn
        self.durations = Histogram(DURATION_BUCKETS)
        """Seconds from a run's start to its end, however it ended."""

    def start(self, agent: Agent, started: RunStarted) -> None:
        """A run's start was committed: run it (unless aborted meanwhile)."""
        run = agent.state.active
        if run is None or run.run_id != started.run_id:
            return  # aborted before its start was even committed
        context = RunContext(
            agent_id=agent.agent_id,
            run_id=run.run_id,
            requests=[p.request for p in run.requests],
            summary=started.summary,
            depth=run.depth,
            clock=self._clock,
            report_steerable=partial(self._steerable, agent, run.run_id),
            gate=self._gate_of(agent.agent_id),
            gate_weight=agent.state.config.gate_weight,
            tools=RunTools(lambda: agent.state, run.run_id, partial(self._record, agent),
                           self.toolbox, self._clock)
            if agent.state.config.tools or agent.state.config.mcp_tools
            or agent.state.config.worker_tools else None,
        )
        agent.context = context
        agent.run_started[run.run_id] = time.perf_counter()
        agent.run = self._spawn(self._run(agent, run, context), f"run {run.run_id}")

    def ended(self, agent: Agent, run_id: str) -> None:
        """A run's end was decided (completed, failed or aborted)."""
        started = agent.run_started.pop(run_id, None)
        if started is not None:
            self.durations.observe(time.perf_counter() - started)

    def steer(self, agent: Agent, steered: RunSteered) -> None:
        """Hand a steered request to its run."""
        context = agent.context
        run = agent.state.active
        if context is None or run is None or context.run_id != steered.run_id:
            return  # the run's task has not started yet: it gets its requests from the state
        request = next(
            p.request for p in reversed(run.requests)
            if p.request.request_id == steered.request_id
        )
        context.deliver_steer(request)

    def tasks_finished(self, agent: Agent, finished: TasksFinished) -> None:
        """Hand the results of a run's sub-agent tasks to the tool waiting for them."""
        context = agent.context
        if context is not None and context.run_id == finished.run_id \
                and isinstance(context.tools, RunTools):
            context.tools.tasks_finished(finished)

    def cancel(self, agent: Agent, run_id: str | None = None) -> None:
        """Cancel the agent's run task (``run_id``: only if it is that run's)."""
        if agent.run is None:
            return
        if run_id is not None and (agent.context is None or agent.context.run_id != run_id):
            return
        agent.run.cancel()
        agent.run = agent.context = None

    async def _run(self, agent: Agent, run: ActiveRun, context: RunContext) -> None:
        reasoner = self._reasoners(agent.agent_id)
        event: Input
        try:
            result: RunResult = await reasoner.run(context)
        except asyncio.CancelledError:
            raise
        except WorkerLostError as error:  # aborted, the requests back at the head
            event = WorkerLost(at=self._clock.now_ms(), run_id=run.run_id,
                               worker=error.worker, rerun=error.rerun)
        except SpendLimitError as error:
            log.warning("run %s: %s; agent %s paused until resume", run.run_id, error,
                        agent.agent_id)
            event = SpendLimitHit(at=self._clock.now_ms(), run_id=run.run_id,
                                  provider=error.provider, reason=error.reason[:500])
        except Exception as error:
            log.warning("run %s failed: %r", run.run_id, error)
            event = RunErrored(at=self._clock.now_ms(), run_id=run.run_id,
                               error=describe(error))
        else:
            event = RunFinished(
                at=self._clock.now_ms(),
                run_id=run.run_id,
                outcome=result.outcome,
                usage=result.usage,
                orders=result.orders,
                prices=self.toolbox.prices({order.symbol for order in result.orders}),
                calls=result.calls,
                answer=result.answer,
                call_results=result.call_results,
            )
        finally:
            if agent.context is context:
                agent.run = agent.context = None
        if self._live(agent):
            try:
                self._feed(agent, event)
            except Unstorable as error:  # a result the log could not hold: the run failed
                log.warning("run %s: %s", run.run_id, error)
                self._feed(agent, RunErrored(at=event.at, run_id=run.run_id,
                                             error=describe(error)))

    async def _record(self, agent: Agent, event: Input) -> list[Decision]:
        """A step of a run: decided, and its decisions once committed (`RunGone` if its
        agent no longer decides here)."""
        if not self._live(agent):
            raise RunGone(f"agent {agent.agent_id} no longer decides here")
        outcome = self._feed(agent, event)
        if outcome.commit is not None:
            # (shielded: a stop cancels the run, and with it this wait, never the commit,
            # which the log's other waiters share: cancelling it made the agent recover
            # from the log, and a stop's ack waited up to 0.8 s for that)
            await asyncio.shield(outcome.commit)
        return outcome.decisions

    def _steerable(self, agent: Agent, run_id: str, steerable: bool) -> None:
        if self._live(agent):
            self._feed(agent, RunSteerability(at=self._clock.now_ms(), run_id=run_id,
                                              steerable=steerable))


def describe(error: BaseException) -> str:
    """An error in words, for the log (at most 500 characters)."""
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 500 else text[:497] + "..."
