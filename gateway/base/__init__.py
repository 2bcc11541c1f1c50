"""What every other part of the gateway stands on: clocks, background tasks, process tuning,
histograms and Prometheus text, pacing of bulk work, the log reader that reads around
quarantined events, and token roles. Imports nothing else of ``gateway``."""
