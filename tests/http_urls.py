"""URLs of tests/http_views.py, under /http/ (see tests/urls.py)."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from tests import http_views

router = SimpleRouter()
router.register("drf/orders", http_views.OrderViewSet, basename="drf-orders")

urlpatterns = [
    path("orders/", http_views.create_order),
    path("orders/<int:shop>/", http_views.create_order),
    path("orders-waiting/", http_views.create_order_waiting),
    path("orders-optional/", http_views.create_order_key_optional),
    path("orders-per-tenant/", http_views.create_order_per_tenant),
    path("orders-for-user/", http_views.create_order_for_user),
    path("raises/", http_views.raise_after_writing),
    path("stream/", http_views.stream),
    path("large/", http_views.large),
    path("upload/", http_views.upload),
    path("class/orders/", http_views.OrderView.as_view()),
    path("drf/create-order/", http_views.drf_create_order),
    path("drf/refuse/", http_views.drf_refuse),
    *router.urls,
]
