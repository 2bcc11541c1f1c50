"""Run every benchmark and write one Markdown report (``bench/results/report.md``).

    uv run python -m bench [--quick]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from bench import estop_latency, gate, replay_speed, scale, throughput, ws_ingest
from bench.common import Figure, machine, table


def main() -> None:
    """Run them all, print the report and save it."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = parser.parse_args()
    size = 10 if args.quick else 1
    sections: list[tuple[str, Callable[[], list[Figure]]]] = [
        ("Durable throughput (`python -m bench.throughput`)",
         lambda: throughput.measure(count=100_000 // size)),
        ("Replay and verify (`python -m bench.replay_speed`)",
         lambda: replay_speed.measure(events=1_000_000 // size)),
        ("Cost per decision by agent count (`python -m bench.scale`)",
         lambda: scale.measure(count=200_000 // size)),
        ("Feed ingest over one WebSocket vs a bare websockets server "
         "(`python -m bench.ws_ingest`)",
         lambda: ws_ingest.measure(count=20_000 // size, batched=100_000 // size)),
        ("Emergency-stop latency under a feed flood (`python -m bench.estop_latency`)",
         lambda: estop_latency.measure(stops=200 // size, seconds=max(3, 10 // size))),
        ("Provider gate: 100 agents saturating 600 RPM (`python -m bench.gate`)",
         lambda: gate.measure(minutes=max(1, 10 // size))),
    ]
    lines = [f"# Benchmark report\n\n{time.strftime('%Y-%m-%d %H:%M')} — {machine()}\n"]
    for title, run in sections:
        lines += [f"## {title}\n", table(run()), ""]
        print("\n".join(lines[-3:]), flush=True)
    out = Path(__file__).parent / "results" / "report.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines))
    print(f"report written to {out}")


if __name__ == "__main__":
    main()
