"""Prometheus metrics of django-workhorse (the ``metrics`` extra: prometheus-client).

``collectors`` holds the metrics, recorded through ``django_workhorse.observability.instruments``; ``views``
serves them (``path("metrics/", include("django_workhorse.observability.metrics.urls"))``), to staff users or
to a scraper sending ``WORKHORSE_METRICS_TOKEN``. See docs/observability.md.
"""

from __future__ import annotations

import os

# Where every process of a gunicorn/uwsgi deployment writes its metrics (prometheus-client's
# setting); read here without prometheus-client, so that callers can ask without the extra.
MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> str | None:
    """The directory of prometheus-client's multiprocess mode, if it is set."""
    return os.environ.get(MULTIPROCESS_DIR) or None
