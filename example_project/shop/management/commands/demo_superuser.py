"""``manage.py demo_superuser``: the demo login admin / admin, on the embedded demo database only.

``make run`` calls it. With ``DATABASE_URL`` set the database is someone's own (a staging copy, a
shared server): a well-known password there is a way in, so the command creates nothing and says
how to create a superuser instead.
"""

from __future__ import annotations

import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

USERNAME = PASSWORD = "admin"


class Command(BaseCommand):
    help = "Create the demo superuser admin / admin, only on the embedded demo database (DATABASE_URL unset)."

    def handle(self, *args: Any, **options: Any) -> None:
        if os.environ.get("DATABASE_URL"):
            self.stdout.write(
                "DATABASE_URL is set: no demo superuser is created in that database. "
                "Create one with: python manage.py createsuperuser"
            )
            return
        users = get_user_model().objects
        if users.filter(username=USERNAME).exists():
            return
        users.create_superuser(USERNAME, "admin@example.com", PASSWORD)
        self.stdout.write(f"Created the demo superuser {USERNAME} / {PASSWORD}")
