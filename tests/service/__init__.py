"""Tests of the gateway service modules: market events, hooks, feed, broker, config."""
