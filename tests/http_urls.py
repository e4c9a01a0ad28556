"""URLs of tests/http_views.py, under /http/ (see tests/urls.py)."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from tests import http_views

router = SimpleRouter()
router.register("drf/orders", http_views.OrderViewSet, basename="drf-orders")
router.register("placed/viewset", http_views.PlacedOnViewSetAction, basename="placed-viewset")

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
    path("sealed/by-setting/", http_views.sealed_by_setting),
    path("sealed/by-argument/", http_views.sealed_by_argument),
    path("sealed/never/", http_views.never_sealed),
    path("class/orders/", http_views.OrderView.as_view()),
    path("drf/create-order/", http_views.drf_create_order),
    path("drf/refuse/", http_views.drf_refuse),
    path("placed/below-api-view/", http_views.placed_below_api_view),
    path("placed/handler/", http_views.PlacedOnHandler.as_view()),
    path("placed/method-decorator/", http_views.PlacedByMethodDecorator.as_view()),
    path("placed/dispatch/", http_views.PlacedOnDispatch.as_view()),
    path("placed/dispatch-in-class-body/", http_views.PlacedOnDispatchInClassBody.as_view()),
    path("placed/django-class/", http_views.SessionOrderView.as_view()),
    path("placed/django-function/", http_views.session_order),
    *router.urls,
]
