"""`gateway whatif`: the recorded inputs re-run under another config, and per agent how
runs, drops, dedupes, suppressions and waits change."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from gateway.base.process import gc_paused
from gateway.base.quarantine import LogReader, log_reader
from gateway.config import ConfigError, validate_config
from gateway.market.prices import PriceWords
from gateway.tools.logs import (
    DebugError,
    Log,
    Out,
    config_table,
    open_log,
    pages,
    shown,
    table,
)
from gateway.tools.progress import Progress, summary
from lanes import AgentConfig
from lanes.whatif import AgentWhatIf, Tally, whatif
from store import RecordedEvent

# ------------------------------------------------------------------------------- what-if


def market_words(path: Path) -> PriceWords:
    """Prices in words to the ``[market]`` ticks of a gateway config file (nothing else of it
    is read)."""
    try:
        market = validate_config({"market": config_table(path).get("market", {})},
                                 str(path)).market
    except ConfigError as error:
        raise DebugError(str(error)) from None
    return PriceWords(market.tick, market.ticks())


def whatif_configs(path: Path) -> dict[str, AgentConfig]:
    """The lane policy of every ``[[agents]]`` table of a gateway config file (tokens,
    providers and reasoners are not needed and not read)."""
    data = config_table(path)
    agents = data.get("agents", [])
    if not isinstance(agents, list) or not agents:
        raise DebugError(f"{path}: no [[agents]] tables: nothing to compare")
    policies = [{k: v for k, v in a.items() if k != "reasoner"} if isinstance(a, dict) else a
                for a in agents]
    try:
        return validate_config({"agents": policies}, str(path)).agent_configs()
    except ConfigError as error:
        raise DebugError(str(error)) from None


def whatif_command(db: Log, config_path: Path, out: Out) -> int:
    """Re-run the recorded inputs under another config; print, per agent, how runs, drops,
    dedupes, suppressions and waits change."""
    configs = whatif_configs(config_path)

    async def read() -> tuple[list[RecordedEvent], LogReader]:
        store = await open_log(db)
        try:
            last = await store.last_position()
            records: list[RecordedEvent] = []
            with Progress("reading", last) as bar:
                async for page in pages(store, 0, last):
                    records += page
                    bar.advance(len(page))
            return records, await log_reader(store)
        finally:
            await store.close()

    with gc_paused():
        records, reader = asyncio.run(read())
        entries = reader.entries(records)
        del records
        with Progress("what-if", len(entries)) as bar:
            report = whatif(entries, configs, bar.advance)
    in_log = {agent.agent_id for agent in report}
    out(f"what-if: {shown(db)} re-run under the agents of {config_path}")
    out("  model (lanes.whatif): recorded inputs at their times, timers re-derived; each run\n"
        "  replays the recorded run that held its first request (duration, outcome, tokens);\n"
        "  orders and sub-agent calls are not simulated")
    for agent in report:
        out("")
        for line in whatif_report(agent):
            out(line)
    missing = sorted(set(configs) - in_log)
    if missing:
        out(f"\nnot in the log (nothing to compare): {', '.join(missing)}")
    out(f"\nwhat-if: {len(report)} agent(s), {summary(len(entries), 'events', bar.elapsed)}")
    return 0


WHATIF_ROWS: tuple[tuple[str, Callable[[Tally], int | None]], ...] = (
    ("requests received", lambda t: t.received),
    ("accepted", lambda t: t.accepted),
    ("runs", lambda t: t.runs),
    ("runs completed", lambda t: t.completed),
    ("runs aborted", lambda t: t.aborted),
    ("dropped", lambda t: t.dropped),
    ("summarized", lambda t: t.summarized),
    ("deduped", lambda t: t.deduped),
    ("rejected", lambda t: t.rejected),
    ("suppressions", lambda t: t.suppressions),
    ("steered", lambda t: t.steered),
    ("accepted, never ran", lambda t: t.never_ran),
    ("wait p50 (ms)", lambda t: t.wait(0.5)),
    ("wait p95 (ms)", lambda t: t.wait(0.95)),
    ("wait max (ms)", lambda t: max(t.waits, default=None)),
)


def _setting(value: object) -> str:
    return "none" if value is None else str(value)


def whatif_report(agent: AgentWhatIf) -> list[str]:
    """One agent: what changed in its config, then recorded vs what-if, row by row."""
    changes = agent.config_changes()
    if agent.config is None:
        heading = "recorded config kept"
        if agent.whatif != agent.recorded:
            heading += (" (re-simulated, it differs from its log: the model does not "
                        "reproduce this log exactly; compare with the what-if column)")
    elif not changes:
        heading = "same config as recorded"
    else:
        heading = "; ".join(f"{key} {_setting(before)} -> {_setting(after)}"
                            for key, before, after in changes)
    rows = []
    for name, measure in WHATIF_ROWS:
        before, after = measure(agent.recorded), measure(agent.whatif)
        change = None if before is None or after is None or before == after \
            else f"{after - before:+,}"
        rows.append([name, before, after, change])
    return [f"{agent.agent_id}: {heading}",
            *("  " + line for line in table(["", "recorded", "what-if", "change"], rows, "<>>>"))]
