"""The PL/pgSQL function a single keyed enqueue calls: installed by migrate, kept at this version's body."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.sql import emit_post_migrate_signal
from django.db import DatabaseError, connection, transaction
from django.db.migrations.recorder import MigrationRecorder
from django.test import override_settings

from django_workhorse import EnqueueOutcome, Idempotency, enqueue_with_result
from django_workhorse.sql import http_records
from django_workhorse.sql.enqueue import (
    CREATE_ENQUEUE_ONE_FUNCTION,
    DROP_ENQUEUE_ONE_FUNCTION,
    ENQUEUE_ONE_FUNCTION,
    create_enqueue_one_function,
)

pytestmark = pytest.mark.django_db

KEY = Idempotency("order-1")


def _installed_bodies() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", [ENQUEUE_ONE_FUNCTION])
        return [row[0] for row in cursor.fetchall()]


def test_the_database_holds_this_versions_body_once():
    body = CREATE_ENQUEUE_ONE_FUNCTION.split("$function$")[1]
    assert _installed_bodies() == [body]


def test_migrate_puts_a_dropped_function_back():
    with connection.cursor() as cursor:
        cursor.execute(DROP_ENQUEUE_ONE_FUNCTION)
    with pytest.raises(DatabaseError, match=ENQUEUE_ONE_FUNCTION), transaction.atomic():
        enqueue_with_result("t", {"n": 1}, idempotency=KEY)

    call_command("migrate", verbosity=0)

    assert enqueue_with_result("t", {"n": 1}, idempotency=KEY).outcome == EnqueueOutcome.ACCEPTED
    assert enqueue_with_result("t", {"n": 1}, idempotency=KEY).outcome == EnqueueOutcome.REPLAYED


def test_migrate_replaces_a_stale_body():
    stale = CREATE_ENQUEUE_ONE_FUNCTION.replace("RETURN QUERY", "RETURN QUERY /* an older release */", 1)
    with connection.cursor() as cursor:
        cursor.execute(stale)
    assert _installed_bodies() != [CREATE_ENQUEUE_ONE_FUNCTION.split("$function$")[1]]

    call_command("migrate", verbosity=0)

    assert _installed_bodies() == [CREATE_ENQUEUE_ONE_FUNCTION.split("$function$")[1]]


@pytest.mark.django_db(transaction=True)
def test_migrating_back_before_the_function_drops_it_and_forward_brings_it_back():
    try:
        call_command("migrate", "workhorse", "0010", verbosity=0)
        assert _installed_bodies() == []
    finally:
        call_command("migrate", "workhorse", verbosity=0)
    assert _installed_bodies() == [CREATE_ENQUEUE_ONE_FUNCTION.split("$function$")[1]]


def test_a_database_built_without_migrations_gets_the_function_after_migrate():
    """With migrations disabled (as pytest's --nomigrations does), post_migrate still installs it."""
    with connection.cursor() as cursor:
        cursor.execute(DROP_ENQUEUE_ONE_FUNCTION)
    MigrationRecorder(connection).migration_qs.filter(app="workhorse").delete()  # no migration recorded
    with override_settings(MIGRATION_MODULES={"workhorse": None}):
        emit_post_migrate_signal(verbosity=0, interactive=False, db="default")

    assert _installed_bodies() == [CREATE_ENQUEUE_ONE_FUNCTION.split("$function$")[1]]


# -- the claim function of @idempotent views (migration 0012) --------------------------------------


def _claim_bodies() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", [http_records.CLAIM_FUNCTION])
        return [row[0] for row in cursor.fetchall()]


CLAIM_BODY = http_records.CREATE_CLAIM_FUNCTION.split("$function$")[1]


def test_migrate_puts_a_dropped_or_stale_claim_function_back():
    with connection.cursor() as cursor:
        cursor.execute(http_records.DROP_CLAIM_FUNCTION)
    assert _claim_bodies() == []
    call_command("migrate", verbosity=0)
    assert _claim_bodies() == [CLAIM_BODY]

    with connection.cursor() as cursor:
        cursor.execute(http_records.CREATE_CLAIM_FUNCTION.replace("RETURN QUERY", "RETURN QUERY /* older */", 1))
    call_command("migrate", verbosity=0)
    assert _claim_bodies() == [CLAIM_BODY]


@pytest.mark.django_db(transaction=True)
def test_migrating_back_before_0012_drops_the_claim_function_and_keeps_enqueues():
    try:
        call_command("migrate", "workhorse", "0011", verbosity=0)
        assert _claim_bodies() == []
        # Before 0025 the function leaves cipher_salt (not there yet) alone.
        assert _installed_bodies() == [create_enqueue_one_function(cipher_salt=False).split("$function$")[1]]
    finally:
        call_command("migrate", "workhorse", verbosity=0)
    assert _claim_bodies() == [CLAIM_BODY]


@pytest.mark.django_db(transaction=True)
def test_migrating_back_before_0025_keeps_keyed_enqueues_and_forward_writes_salts_again():
    try:
        call_command("migrate", "workhorse", "0024", verbosity=0)
        assert _installed_bodies() == [create_enqueue_one_function(cipher_salt=False).split("$function$")[1]]
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM information_schema.columns WHERE column_name = 'cipher_salt'")
            assert cursor.fetchone() == (0,)
        assert enqueue_with_result("t", {"n": 1}, idempotency=KEY).outcome == EnqueueOutcome.ACCEPTED
        assert enqueue_with_result("t", {"n": 1}, idempotency=KEY).outcome == EnqueueOutcome.REPLAYED
    finally:
        call_command("migrate", "workhorse", verbosity=0)
    assert _installed_bodies() == [CREATE_ENQUEUE_ONE_FUNCTION.split("$function$")[1]]
    assert enqueue_with_result("t", {"n": 2}, idempotency=Idempotency("order-2")).outcome == EnqueueOutcome.ACCEPTED


def test_a_database_built_without_migrations_gets_the_claim_function_too():
    with connection.cursor() as cursor:
        cursor.execute(http_records.DROP_CLAIM_FUNCTION)
    MigrationRecorder(connection).migration_qs.filter(app="workhorse").delete()
    with override_settings(MIGRATION_MODULES={"workhorse": None}):
        emit_post_migrate_signal(verbosity=0, interactive=False, db="default")

    assert _claim_bodies() == [CLAIM_BODY]
