"""A graceful stop never hangs: `gateway serve`'s server ends the process once its stop has
taken longer than ``shutdown_timeout_s``, even while the event loop is stuck."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

SCRIPT = textwrap.dedent("""
    import asyncio, time
    import uvicorn
    from gateway.edge.server import GatewayServer

    async def never() -> None:
        time.sleep(60)  # a stop that holds the loop itself

    async def main() -> None:
        server = GatewayServer(uvicorn.Config(lambda *a: None))
        server.exit_after_s = 0.5
        server.on_shutdown.append(never)
        await server.shutdown()

    asyncio.run(main())
""")


def test_a_stop_that_hangs_ends_the_process_after_the_timeout_saying_so() -> None:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=30)
    took = time.monotonic() - started
    assert done.returncode == 70, done.stderr
    assert "stopping took longer than 0.5 s" in done.stderr
    assert took < 20
