"""The metrics endpoint: Prometheus's text format, for staff users and for a bearer token.

With ``PROMETHEUS_MULTIPROC_DIR`` set (gunicorn or uwsgi with several worker processes, see
docs/observability.md), the counters and histograms are those every process of the directory
recorded, added up; otherwise this process's. The gauges come from PostgreSQL either way.
"""

from __future__ import annotations

import hmac
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

from django_workhorse.conf import app_settings

try:
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector
except ImportError as exc:  # the URLconf includes this module: say what is missing, at startup
    raise ImproperlyConfigured(
        "django_workhorse.observability.metrics needs prometheus-client: pip install 'django-workhorse[metrics]'"
    ) from exc

from django_workhorse.observability.metrics import multiprocess_dir  # noqa: E402 (after the import check)
from django_workhorse.observability.metrics.gauges import DatabaseGauges  # noqa: E402

SCHEME = "bearer"
REALM = 'Bearer realm="workhorse-metrics"'
# The gauges read from PostgreSQL, in the registry the endpoint serves (only where it is served).
GAUGES = DatabaseGauges()
REGISTRY.register(GAUGES)


def metrics(request: HttpRequest) -> HttpResponse:
    """Serve the metrics to a staff user, or to a request bearing ``WORKHORSE_METRICS_TOKEN``."""
    if not (_bears_the_token(request) or _is_staff(request)):
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return HttpResponse("Staff only.\n", status=403, content_type="text/plain")
        response = HttpResponse("Authentication required.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = REALM
        return response
    return HttpResponse(generate_latest(served_registry()), content_type=CONTENT_TYPE_LATEST)


def served_registry() -> CollectorRegistry:
    """What the endpoint serves: every process's metrics in multiprocess mode, else this process's."""
    directory = multiprocess_dir()
    if directory is None:
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    registry.register(GAUGES)
    return registry


def _bears_the_token(request: HttpRequest) -> bool:
    token = app_settings.METRICS_TOKEN
    scheme, _, credentials = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    # An authentication scheme is case-insensitive (RFC 9110, section 11.1): bearer, BEARER...
    if not token or not scheme.isascii() or scheme.lower() != SCHEME:
        return False
    return hmac.compare_digest(credentials.strip().encode(), token.encode())


def _is_staff(request: HttpRequest) -> bool:
    user: Any = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff)
