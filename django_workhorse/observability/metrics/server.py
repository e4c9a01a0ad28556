"""``workhorse_worker --metrics-port``: serve the worker process's own metrics over HTTP.

prometheus-client's server, on a daemon thread: the counters and histograms this process records
(attempts, handler and claim durations, lease losses, reclaims; enqueues its handlers make), and
the schedules its evaluations leave out. Not the gauges read from PostgreSQL: the web endpoint
reads those, once for every worker.
"""

from __future__ import annotations

from prometheus_client import start_http_server


def serve(address: str, port: int) -> None:
    """Serve this process's metrics on ``address:port`` until the process exits (OSError if taken)."""
    start_http_server(port, addr=address)
