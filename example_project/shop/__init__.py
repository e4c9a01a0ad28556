"""The demo shop: orders whose confirmation is sent by a django-workhorse job."""
