"""``path("metrics/", include("django_workhorse.observability.metrics.urls"))``: the metrics endpoint."""

from __future__ import annotations

from django.urls import path

from django_workhorse.observability.metrics import views

app_name = "workhorse_metrics"
urlpatterns = [path("", views.metrics, name="metrics")]
