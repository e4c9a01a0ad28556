"""A small shop that places orders through django-workhorse: the demo behind ``make run``."""
