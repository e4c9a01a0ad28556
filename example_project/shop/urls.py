"""URLs of the demo shop: one page per scenario."""

from __future__ import annotations

from django.urls import path

from example_project.shop import api, views

urlpatterns = [
    path("", views.home, name="home"),
    path("orders/", views.orders, name="orders"),
    path("orders/<int:order_id>/", views.order_detail, name="order-detail"),
    path("orders/<int:order_id>/fulfil/", views.fulfil_order, name="fulfil-order"),
    path("webhooks/", views.webhooks, name="webhooks"),
    path("webhooks/provider/", views.provider_webhook, name="provider-webhook"),
    path("invoices/", views.invoices, name="invoices"),
    path("invoices/<int:invoice_id>/", views.invoice_detail, name="invoice-detail"),
    path("invoices/<int:invoice_id>/capture/", views.capture_invoice, name="capture-invoice"),
    path("search-index/", views.search_index, name="search-index"),
    path("search-index/<int:product_id>/", views.edit_product, name="edit-product"),
    path("digest/", views.digest, name="digest"),
    path("conflict/", views.conflict, name="conflict"),
    path("api/orders/", api.api_orders, name="api-orders"),
    path("api/invoices/<int:invoice_id>/capture/", api.api_capture_invoice, name="api-capture-invoice"),
]
