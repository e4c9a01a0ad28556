"""Observability: metrics instruments, the metrics endpoint, traces, log fields and keyed-request rates."""
