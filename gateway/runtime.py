"""Process-level settings for a long-running gateway."""

from __future__ import annotations

import gc


def tune_gc() -> None:
    """Make the cyclic GC cheap for a process that holds many long-lived objects.

    Agent states, pending requests and dedupe windows live long; with the default
    thresholds the collector rescans them over and over (measured: about a third of the
    time per request under a flood). Objects alive now are frozen out of collection, and
    full collections run ten times less often. Call once, after start-up.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(700, 20, 100)
