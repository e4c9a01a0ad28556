"""The migrations match the models, without the Makefile: makemigrations --check finds nothing to write."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_models_and_migrations_agree():
    out = StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out)
    except SystemExit:  # raised when a migration would be written
        pytest.fail(f"makemigrations would write a migration:\n{out.getvalue()}")
    assert out.getvalue() == "No changes detected\n"
