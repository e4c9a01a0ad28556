"""``manage.py demo_superuser`` (what ``make run`` calls): admin / admin on the embedded demo database
only; with DATABASE_URL set it creates nobody in that database and says how to create a superuser."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def run() -> str:
    out = StringIO()
    call_command("demo_superuser", stdout=out)
    return out.getvalue()


def test_demo_superuser_with_database_url_creates_nobody_and_says_how(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://someone@db.example.com/production")

    output = run()

    assert not get_user_model().objects.exists()
    assert "DATABASE_URL is set" in output and "manage.py createsuperuser" in output


def test_demo_superuser_on_the_embedded_database_creates_admin_once(monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)

    assert run() == "Created the demo superuser admin / admin\n"
    assert run() == ""

    [user] = get_user_model().objects.all()
    assert (user.username, user.is_superuser, user.is_staff) == ("admin", True, True)
    assert user.check_password("admin")
