"""The dashboard page: queue depths (paused and fair queues marked), failing jobs, throughput over the last hour, recent failures,
workers (alive or stale), next ticks, and per scope the live bindings and what the keys saved."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from django_workhorse import rate_limits
from django_workhorse.observability import instruments, keyed_rates
from django_workhorse.operations import stats
from django_workhorse.operations.fair import fair_queues
from django_workhorse.schedules import overview as schedule_overview

from .display import error_head, error_summary
from .states import failing_by_queue, worker_state

DASHBOARD_REFRESH_SECONDS = 10
# This process's readings of the keyed-request counters, one per render: each render shows the
# rates since the oldest reading of the last five minutes.
RECENT_KEYED = keyed_rates.RecentTotals()


def dashboard_view(model_admin: admin.ModelAdmin, request: HttpRequest) -> HttpResponse:  # type: ignore[type-arg]
    """Queue depths, throughput over the last hour, recent failures, workers, the rate limits' budgets
    and the schedules' next ticks; refreshes itself.

    Shown to whoever may view ``model_admin``'s model (the jobs).
    """
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    now = timezone.now()
    depths = stats.queue_depths(now=now)
    paused = {queue.queue: queue for queue in stats.paused_queue_counts()}
    throughput = stats.throughput(now=now)
    failing = failing_by_queue()
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Workhorse dashboard",
        "opts": model_admin.model._meta,
        "now": now,
        "depths": depths,
        "queue_rows": [(depth, paused.get(depth.queue)) for depth in depths],
        "paused": list(paused.values()),
        "without_handler": stats.jobs_without_handler(now=now)[: stats.MAX_WARNING_NAMES],
        "fair_queues": set(fair_queues()),
        "throughput": throughput,
        "chart": throughput_chart(throughput),
        "failures": [(job, error_summary(error_head(job))) for job in stats.recent_failures()],
        "failing": failing,
        "failing_total": sum(count for _, count in failing),
        "workers": [(worker, worker_state(worker.heartbeat_at, now)) for worker in stats.workers()],
        "rate_budgets": rate_limits.budgets(),
        "upcoming": schedule_overview.upcoming_ticks(now=now),
        "schedule_counts": schedule_overview.schedule_counts(),
        "scopes": keyed_rates.by_scope(stats.live_bindings(now=now), RECENT_KEYED.rates()),
        "metrics_on": instruments.recording(),
        "refresh_seconds": DASHBOARD_REFRESH_SECONDS,
    }
    return TemplateResponse(request, "admin/workhorse/dashboard.html", context)


def throughput_chart(throughput: stats.Throughput, *, width: int = 720, height: int = 140) -> dict[str, Any]:
    """Lay out the per-minute bars of an SVG chart (succeeded stacked under failed)."""
    peak = max((s + f for s, f in zip(throughput.succeeded, throughput.failed, strict=True)), default=0) or 1
    step = width / max(len(throughput.minutes), 1)
    bars = []
    for i, (minute, ok, failed) in enumerate(
        zip(throughput.minutes, throughput.succeeded, throughput.failed, strict=True)
    ):
        ok_height = height * ok / peak
        failed_height = height * failed / peak
        bars.append(
            {
                "x": round(i * step, 1),
                "width": round(max(step - 1, 1), 1),
                "ok_y": round(height - ok_height, 1),
                "ok_height": round(ok_height, 1),
                "failed_y": round(height - ok_height - failed_height, 1),
                "failed_height": round(failed_height, 1),
                "label": f"{minute:%H:%M} — {ok} succeeded, {failed} failed",
            }
        )
    return {"width": width, "height": height, "peak": peak, "bars": bars}
