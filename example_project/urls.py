"""URLs of the demo project."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from example_project import views

urlpatterns = [
    path("", views.home, name="home"),
    path("orders/", views.place_order, name="place-order"),
    path("orders/<int:order_id>/", views.order_detail, name="order-detail"),
    path("admin/", admin.site.urls),
]
