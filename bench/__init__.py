"""Benchmarks: each module measures one thing and returns rows for the report."""
