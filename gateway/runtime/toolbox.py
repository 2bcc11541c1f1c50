"""The built-in tools at work for a run: each step recorded, each tool run, each result
recorded, in the order the model asked.

`RunTools` is a run's `gateway.llm.reasoner.ToolSession`: a model call becomes the input
`ModelCalled`; the pure core decides which tool calls may go ahead (`lanes.decide_steps`),
places or cancels orders at once, schedules and sends sub-agent tasks (the run waits in
``execute_scheduled_tasks`` for their results: `RunTools.tasks_finished`); the reads
(``market_snapshot``, ``candles``, ``positions``, ``open_orders``, ``agent_status``,
``get_queue_status``) are answered here from the market book and the agents' states; every
result becomes the input `ToolReturned`. A result longer than `STEP_TEXT_LIMIT` is cut in the
log and in what the model reads, with the whole's size and SHA-256. A tool that raises is a
tool error the model reads; the run goes on.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from gateway.base.clock import Clock
from gateway.errors import GatewayError
from gateway.llm.mcp_tools import McpTools
from gateway.llm.port import Completion, ToolCall, ToolResult, ToolSpec
from gateway.market.book import MarketBook
from gateway.market.prices import PriceWords
from lanes.decide_steps import order_id
from lanes.events import (
    STEP_TEXT_LIMIT,
    ApprovalRequested,
    CallResult,
    CallStatus,
    Decision,
    Input,
    ModelCalled,
    OrderAccepted,
    OrderRejected,
    RunResultIgnored,
    StepDecided,
    TasksFinished,
    TasksScheduled,
    ToolCallMade,
    ToolReturned,
)
from lanes.state import AgentState
from lanes.tools import (
    TOOLS,
    AgentArguments,
    CandlesArguments,
    SymbolArguments,
    tool_arguments,
    tool_schema,
)

Record = Callable[[Input], Awaitable[list[Decision]]]
"""Feed an input to the run's agent and wait for its commit: its decisions."""


class RunGone(GatewayError):
    """The run is no longer its agent's active run (aborted, or its agent moved)."""

    code = "conflict"


class Toolbox:
    """Where the read tools read: the market book and the agents' states."""

    def __init__(self, market: MarketBook | None, state_of: Callable[[str], AgentState],
                 clock: Clock, mcp: McpTools | None = None) -> None:
        self.market = market or MarketBook()
        self.mcp = mcp
        """The agents' MCP servers (`gateway.llm.mcp_tools`), if any."""
        self._state_of = state_of
        self._clock = clock

    def prices(self, symbols: Iterable[str]) -> dict[str, float]:
        """The latest price of each of ``symbols`` known (what approval rules reckon with)."""
        known = {symbol: self.market.price(symbol) for symbol in symbols}
        return {symbol: seen[0] for symbol, seen in known.items() if seen is not None}

    def read(self, state: AgentState, name: str, arguments: dict[str, Any]) -> Any:
        """The answer of a read tool for the agent in ``state``, as JSON-able data."""
        args = tool_arguments(name, arguments)
        market = self.market
        if isinstance(args, SymbolArguments):
            snapshot = market.snapshot(args.symbol, self._clock.now_ms())
            if snapshot is None:
                known = ", ".join(market.symbols()) or "none yet"
                raise LookupError(f"no price seen for {args.symbol} (symbols: {known})")
            return snapshot
        if isinstance(args, CandlesArguments):
            return market.candles(args.symbol, args.interval, args.count)
        if isinstance(args, AgentArguments):
            return _status(self._state_of(args.agent_id))
        if name == "positions":
            return [_position(symbol, qty, market.price(symbol))
                    for symbol, qty in sorted(state.positions.items()) if qty]
        if name == "open_orders":
            return [{"orderId": o.order_id, **o.intent.model_dump(mode="json"),
                     "filledQty": o.filled_qty, "cancelRequested": o.cancel_requested}
                    for o in state.orders.values()]
        raise LookupError(f"{name} is not a read tool")


def _position(symbol: str, qty: float, seen: tuple[float, int] | None) -> dict[str, Any]:
    price = None if seen is None else seen[0]
    return {"symbol": symbol, "qty": qty, "lastPrice": price,
            "marketValue": None if price is None else qty * price}


def _status(state: AgentState) -> dict[str, Any]:
    run = state.active
    return {"agentId": state.agent_id, "trading": state.trading.value,
            "lane": state.lane.value, "pending": len(state.pending),
            "activeRun": None if run is None else run.run_id,
            "openOrders": len(state.orders)}


def cut(text: str) -> tuple[str, int, str | None]:
    """A result as the log keeps it: the text (cut at `STEP_TEXT_LIMIT`), the whole's
    length, and its SHA-256 when it was cut."""
    if len(text) <= STEP_TEXT_LIMIT:
        return text, len(text), None
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    note = f"... [cut: {len(text)} characters, sha256 {digest}]"
    return text[:STEP_TEXT_LIMIT - len(note)] + note, len(text), digest


class RunTools:
    """One run's tools (`gateway.llm.loop.ToolSession`)."""

    def __init__(self, state: Callable[[], AgentState], run_id: str, record: Record,
                 toolbox: Toolbox, clock: Clock) -> None:
        self._state = state
        self.run_id = run_id
        self._record = record
        self._toolbox = toolbox
        self._clock = clock
        config = state().config
        self._mcp = toolbox.mcp if config.mcp_tools else None
        self._agent_id = state().agent_id
        self.specs: Sequence[ToolSpec] = (*(
            ToolSpec(name, TOOLS[name].description, tool_schema(TOOLS[name]))
            for name in config.tools), *(() if self._mcp is None else self._mcp.specs(
                self._agent_id, config.mcp_tools)))
        self.max_steps = config.max_steps
        self._batches: dict[str, asyncio.Future[tuple[CallResult, ...]]] = {}
        """Batch id -> the results of the calls an ``execute_scheduled_tasks`` sent."""

    async def step(self, step: int, completion: Completion, steered: Sequence[str] = (),
                   given: Mapping[str, tuple[bool, str]] | None = None) -> list[ToolResult]:
        """Record a model call as step ``step``; run what it may (the results of a worker's
        own tools are ``given``); the results, in order."""
        calls = [ToolCallMade(call_id=call.id, name=call.name, arguments=dict(call.arguments),
                              malformed=None if call.malformed is None
                              else call.malformed[:STEP_TEXT_LIMIT])
                 for call in completion.tool_calls]
        symbols = {str(c.arguments.get("symbol")) for c in completion.tool_calls
                   if c.name == "place_order"}
        decisions = await self._record(ModelCalled(
            at=self._clock.now_ms(), run_id=self.run_id, step=step,
            input_tokens=completion.input_tokens, output_tokens=completion.output_tokens,
            stop_reason=None if completion.stop_reason is None else completion.stop_reason[:64],
            text=cut(completion.text)[0], tool_calls=tuple(calls), steered=tuple(steered),
            prices=self._toolbox.prices(symbols)))
        decided = next((d for d in decisions if isinstance(d, StepDecided)), None)
        if decided is None:
            ignored = next((d.reason for d in decisions if isinstance(d, RunResultIgnored)),
                           "its step was not taken")
            raise RunGone(f"run {self.run_id}: {ignored}")
        refused = {r.call_id: r.error for r in decided.refused}
        orders = iter([d for d in decisions
                       if isinstance(d, OrderAccepted | OrderRejected | ApprovalRequested)])
        results: list[ToolResult] = []
        placed = 0
        for call in completion.tool_calls:
            if call.id in refused:
                results.append(ToolResult(call.id, refused[call.id], is_error=True))
                continue
            if call.name == "place_order":
                placed += 1
                ok, text = _order_answer(next(orders), order_id(self.run_id, step, placed),
                                         self._toolbox.market.words)
            elif call.name == "cancel_order":
                ok, text = True, f"cancel of order {call.arguments.get('orderId')} requested"
            elif call.name == "schedule_tasks":
                ok, text = True, _scheduled(call.id, decisions)
            elif call.name == "execute_scheduled_tasks":
                ok, text = await self._executed(f"{self.run_id}-s{step}", decisions)
            elif call.name == "get_queue_status":
                ok, text = True, _json(self._queue_status())
            elif call.name in self._state().config.worker_tools:
                ok, text = (given or {}).get(call.id, (
                    False, f"the worker sent no result for {call.name} ({call.id})"))
            elif self._mcp is not None and call.name in self._state().config.mcp_tools:
                ok, text = await self._mcp.call(self._agent_id, call.name, call.arguments)
            else:
                ok, text = self._read(call)
            content, size, digest = cut(text)
            results.append(ToolResult(call.id, content, is_error=not ok))
            await self._record(ToolReturned(
                at=self._clock.now_ms(), run_id=self.run_id, step=step, call_id=call.id,
                name=call.name, ok=ok, content=content, size=size, digest=digest))
        return results

    def tasks_finished(self, finished: TasksFinished) -> None:
        """The calls of one of this run's ``execute_scheduled_tasks`` all ended."""
        future = self._batch(finished.batch_id)
        if not future.done():
            future.set_result(finished.results)

    def _batch(self, batch_id: str) -> asyncio.Future[tuple[CallResult, ...]]:
        future = self._batches.get(batch_id)
        if future is None:
            future = self._batches[batch_id] = asyncio.get_running_loop().create_future()
        return future

    async def _executed(self, batch_id: str, decisions: list[Decision]) -> tuple[bool, str]:
        """Wait for the batch's results (each call is bounded by its timeout; a stop of the
        run cancels this wait and the calls with it)."""
        for decision in decisions:  # (every task refused: it ended at once)
            if isinstance(decision, TasksFinished) and decision.batch_id == batch_id:
                self.tasks_finished(decision)
        results = await self._batch(batch_id)
        returned = sum(result.status is CallStatus.RETURNED for result in results)
        return returned > 0 or not results, _json([
            result.model_dump(mode="json", by_alias=True, exclude_none=True)
            for result in results])

    def _queue_status(self) -> dict[str, Any]:
        state = self._state()
        run = state.active
        scheduled = () if run is None or run.run_id != self.run_id else run.scheduled
        book = state.calls
        batches = {key: batch for key, batch in book.batches.items()
                   if batch.awaited_by == self.run_id}
        return {
            "scheduled": [task.model_dump(mode="json", by_alias=True, exclude_none=True)
                          for task in scheduled],
            "sent": [{"callId": call.call_id, "agentId": call.target,
                      "status": "out" if call.dispatched else "queued"}
                     for call in book.open.values() if call.run_id in batches],
            "ended": [result.model_dump(mode="json", by_alias=True, exclude_none=True)
                      for batch in batches.values() for result in batch.ended],
        }

    def _read(self, call: ToolCall) -> tuple[bool, str]:
        try:
            value = self._toolbox.read(self._state(), call.name, dict(call.arguments))
        except Exception as error:  # a tool that raises is a tool error, never a failed run
            return False, f"{type(error).__name__}: {error}"
        return True, _json(value)


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _scheduled(call_id: str, decisions: list[Decision]) -> str:
    count = next(len(d.tasks) for d in decisions
                 if isinstance(d, TasksScheduled) and d.call_id == call_id)
    return f"{count} task(s) scheduled; nothing is sent until execute_scheduled_tasks"


def _order_answer(decision: Decision, expected_id: str, words: PriceWords
                  ) -> tuple[bool, str]:
    assert isinstance(decision, OrderAccepted | ApprovalRequested | OrderRejected)
    said = words.intent(decision.intent)
    if isinstance(decision, OrderAccepted):
        assert decision.order_id == expected_id, (decision.order_id, expected_id)
        return True, f"order {decision.order_id} accepted: {said}"
    if isinstance(decision, ApprovalRequested):
        assert decision.order_id == expected_id, (decision.order_id, expected_id)
        return True, (f"pending approval {decision.approval_id}: {said} "
                      "waits for a human; its outcome comes to you as a request")
    assert isinstance(decision, OrderRejected)
    return False, f"order rejected ({said}): {decision.reason}"



