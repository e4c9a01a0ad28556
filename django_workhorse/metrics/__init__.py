"""Prometheus metrics of django-workhorse (the ``metrics`` extra: prometheus-client).

``collectors`` holds the metrics, recorded through ``django_workhorse.instruments``; ``views``
serves them (``path("metrics/", include("django_workhorse.metrics.urls"))``), to staff users or
to a scraper sending ``WORKHORSE_METRICS_TOKEN``. See docs/observability.md.
"""
