"""`gateway verify`: every recorded input re-decided, in order or in several processes,
and the first divergence shown for people."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from gateway.base.process import gc_paused
from gateway.base.quarantine import UnreadableEvent, log_reader
from gateway.runtime.desk import read_kill
from gateway.tools.logs import Log, Out, open_log, pages
from gateway.tools.progress import Progress, summary
from gateway.tools.timeline import explain, what_came_in
from lanes.events import Event, is_input
from lanes.gate import decode_gate_event, verify_gate
from lanes.replay import Divergence, Entry, Verifier, first
from lanes.streams import DESK_STREAM, PROVIDER_PREFIX, QUARANTINE_STREAM, is_agent_stream
from store import GroupCommitStore, RecordedEvent

# -------------------------------------------------------------------------------- verify


PARALLEL_FROM = 200_000
"""Agent events from which `verify_command` re-decides streams in several processes."""


@dataclass(frozen=True, slots=True)
class Verified:
    """What re-deciding some agent streams found."""

    events: int
    inputs: int
    divergence: Divergence | None
    unreadable: str | None = None


async def verify_command(db: Log, out: Out, jobs: int | None = None) -> int:
    """Re-decide every recorded input (agents and provider gates); 1 at the first
    divergence, printed with its position, input, recorded and re-decided events.

    Agent streams are independent, so a large log is verified in ``jobs`` processes, each
    taking whole streams (default: one per CPU from `PARALLEL_FROM` agent events, else 1);
    the answer is the same either way (`lanes.replay.first`)."""
    store = await open_log(db)
    gates: dict[str, list[RecordedEvent]] = {}
    try:
        last = await store.last_position()
        versions = await store.stream_versions()
        agents = {s: v for s, v in versions.items() if is_agent_stream(s)}
        jobs = jobs or (os.cpu_count() or 1 if sum(agents.values()) >= PARALLEL_FROM else 1)
        with gc_paused(), Progress("verify", last) as bar:
            if jobs > 1 and len(agents) > 1:
                for stream in set(versions) - set(agents) - {QUARANTINE_STREAM, DESK_STREAM}:
                    gates[stream] = await store.read_stream(stream)
                    bar.advance(len(gates[stream]))
                verified = await _verify_in_processes(db, agents, jobs, bar)
            else:
                verified = await _verify_in_order(store, last, gates, bar)
        kills = await store.read_stream(DESK_STREAM)
    finally:
        await store.close()
    unreadable = verified.unreadable or _unreadable_kill(kills)
    if unreadable is not None:
        out(f"verify: FAILED: {unreadable}")
        return 1
    if verified.divergence is not None:
        for line in divergence_report(verified.divergence):
            out(line)
        return 1
    for stream, records in sorted(gates.items()):
        found = verify_gate(stream, (decode_gate_event(r.type, r.data) for r in records))
        if found is not None:
            record = records[min(found.index, len(records) - 1)]
            out(f"verify: DIVERGED at position {record.position} in {stream}\n"
                f"  input:      {found.input}\n  recorded:   {found.recorded}\n"
                f"  re-decided: {found.redecided}")
            return 1
    gate_events = sum(len(v) for v in gates.values())
    processes = f" in {jobs} processes" if jobs > 1 and len(agents) > 1 else ""
    desk = f", {len(kills):,} desk kill{'' if len(kills) == 1 else 's'} read" if kills else ""
    out(f"verify: {verified.events:,} agent events ({verified.inputs:,} inputs re-decided) and "
        f"{gate_events:,} provider gate events ({len(gates)} gates){desk}: no divergence; "
        f"{summary(last, 'events', bar.elapsed)}{processes}")
    return 0


def _unreadable_kill(records: list[RecordedEvent]) -> str | None:
    """Why the first desk kill record that does not read back cannot (None: all read)."""
    for record in records:
        try:
            read_kill(record.data)
        except ValueError as error:
            return (f"the desk kill at position {record.position} ({DESK_STREAM!r}) cannot "
                    f"be read: {error}")
    return None


async def _verify_in_order(store: GroupCommitStore, last: int,
                           gates: dict[str, list[RecordedEvent]], bar: Progress) -> Verified:
    """The whole log in position order, stopping at the first divergence."""
    verifier = Verifier()
    reader = await log_reader(store)
    try:
        async for page in pages(store, 0, last):
            entries = []
            for record in page:
                if is_agent_stream(record.stream):
                    entries.append(Entry(record.position, record.stream,
                                         reader.decode(record)))
                elif record.stream.startswith(PROVIDER_PREFIX):
                    gates.setdefault(record.stream, []).append(record)
            bar.advance(len(page))
            if verifier.feed(entries) is not None:
                break
    except UnreadableEvent as error:
        return Verified(verifier.events, verifier.inputs, None, str(error))
    return Verified(verifier.events, verifier.inputs, verifier.finish())


async def _verify_in_processes(db: Log, streams: Mapping[str, int], jobs: int,
                               bar: Progress) -> Verified:
    """Whole streams re-decided in ``jobs`` processes, the results put together."""
    groups: list[list[str]] = [[] for _ in range(min(len(streams), jobs * 4))]
    sizes = [0] * len(groups)
    for stream in sorted(streams, key=lambda s: -streams[s]):  # biggest first, to the least
        smallest = sizes.index(min(sizes))
        groups[smallest].append(stream)
        sizes[smallest] += streams[stream]
    loop = asyncio.get_running_loop()
    results = []
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with ProcessPoolExecutor(jobs, mp_context=context) as pool:
        waiting = [loop.run_in_executor(pool, verify_streams, db, group)
                   for group in groups if group]
        for done in asyncio.as_completed(waiting):
            result = await done
            bar.advance(result.events)
            results.append(result)
    unreadable = next((r.unreadable for r in results if r.unreadable is not None), None)
    return Verified(sum(r.events for r in results), sum(r.inputs for r in results),
                    first(r.divergence for r in results), unreadable)


def verify_streams(db: Log, streams: list[str]) -> Verified:
    """Re-decide whole agent streams of the log at ``db`` (run in a worker process)."""
    return asyncio.run(_verify_streams(db, streams))


async def _verify_streams(db: Log, streams: list[str]) -> Verified:
    store = await open_log(db)
    events = inputs = 0
    found: list[Divergence | None] = []
    try:
        reader = await log_reader(store)
        with gc_paused():
            for stream in streams:
                verifier = Verifier()
                verifier.feed(reader.entries(await store.read_stream(stream)))
                found.append(verifier.finish())
                events += verifier.events
                inputs += verifier.inputs
    except UnreadableEvent as error:
        return Verified(events, inputs, None, str(error))
    finally:
        await store.close()
    return Verified(events, inputs, first(found))


def divergence_report(divergence: Divergence) -> list[str]:
    """The first divergence, for people: where, the input, recorded and re-decided."""
    def shown(event: Event | None) -> str:
        if event is None:
            return "(nothing)"
        return f"{type(event).__name__}: {explain(event)}" if not is_input(event) \
            else what_came_in(event)

    input_at = divergence.input_position
    return [
        f"verify: DIVERGED at position {divergence.position} in stream "
        f"{divergence.stream!r}",
        f"  input       {'' if input_at is None else f'@{input_at}':<8} "
        f"{shown(divergence.input)}",
        f"  recorded    {f'@{divergence.position}':<8} {shown(divergence.recorded)}",
        f"  re-decided  {'':<8} {shown(divergence.redecided)}",
        "",
        f"  recorded:   {divergence.recorded!r}",
        f"  re-decided: {divergence.redecided!r}",
    ]
