"""The market side: market events, the synthetic feed, hook rules that turn them into requests,
and the paper broker."""
