"""The models: binding liveness (ORM and SQL from one rule), the hashed-key base, and what deleting a job
takes with it (ON DELETE CASCADE, migration 0007)."""

from __future__ import annotations

import hashlib
import itertools
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_workhorse import sql
from django_workhorse.enqueueing.fingerprints import key_digest
from django_workhorse.enqueueing.key_lifetimes import FREED_BY, TERMINAL_JOB_STATUSES
from django_workhorse.models import (
    TERMINAL_STATUSES,
    Checkpoint,
    EffectRecord,
    HashedKey,
    IdempotencyBinding,
    Job,
    JobEvent,
    JobStatus,
    Redrive,
)
from django_workhorse.sql.keys import FREE
from django_workhorse.types import KeyMode
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

# The job states a binding can point at: (status, attempts started).
JOB_STATES = {
    "queued-never-started": (JobStatus.QUEUED, 0),
    "queued-retrying": (JobStatus.QUEUED, 1),
    "running": (JobStatus.RUNNING, 1),
    "succeeded": (JobStatus.SUCCEEDED, 1),
    "dead": (JobStatus.DEAD, 3),
    "cancelled": (JobStatus.CANCELLED, 0),
}
# expires_at relative to now; None is a timed key written without an expiry (never free by time).
EXPIRIES: dict[str, timedelta | None] = {
    "expired": -timedelta(seconds=1),
    "expires-now": timedelta(0),
    "not-expired": timedelta(hours=1),
    "no-expiry": None,
}


def make_binding(job: Job, mode: str, expires_at: datetime | None, n: int) -> IdempotencyBinding:
    return IdempotencyBinding.objects.create(
        scope="liveness",
        key_hash=hashlib.sha256(f"liveness\x1f{n}".encode()).digest(),
        key_preview="•",
        mode=mode,
        request_digest=bytes(32),
        field_digests={},
        job=job,
        created_at=timezone.now(),
        expires_at=expires_at,
    )


def expected_free(mode: str, status: str, expired: bool) -> bool:
    """The documented rule, restated by hand (docs/keys: when a key can be taken over)."""
    terminal = status in {"succeeded", "dead", "cancelled"}
    return {"idempotency": expired, "throttle": expired, "unique": terminal, "debounce": terminal and expired}[mode]


def sql_free(now: datetime) -> dict[int, bool]:
    """Evaluate ``FREE`` itself over every binding, as ``WHERE FREE`` reads it (NULL is not free)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT binding.id, ({FREE.format(now="%(now)s")}) IS TRUE
            FROM workhorse_binding AS binding JOIN workhorse_job AS job ON job.id = binding.job_id""",
            {"now": now},
        )
        return dict(cursor.fetchall())


def test_the_queryset_and_the_sql_fragment_agree_on_every_mode_job_state_and_expiry():
    now = timezone.now()
    cases: dict[int, tuple[str, str, str]] = {}
    for n, (mode, state, expiry) in enumerate(itertools.product(KeyMode, JOB_STATES, EXPIRIES)):
        status, attempt = JOB_STATES[state]
        offset = EXPIRIES[expiry]
        job = JobFactory(status=status, attempt=attempt)
        binding = make_binding(job, mode.value, None if offset is None else now + offset, n)
        cases[binding.pk] = (mode.value, state, expiry)
    assert len(cases) == 4 * 6 * 4

    in_sql = sql_free(now)
    free = set(IdempotencyBinding.objects.free(now).values_list("pk", flat=True))
    live = set(IdempotencyBinding.objects.live(now).values_list("pk", flat=True))
    disagreements = [cases[pk] for pk in cases if in_sql[pk] != (pk in free) or in_sql[pk] == (pk in live)]
    assert disagreements == []
    wrong = [
        cases[pk]
        for pk, (mode, state, expiry) in cases.items()
        if in_sql[pk] != expected_free(mode, JOB_STATES[state][0], expiry in {"expired", "expires-now"})
    ]
    assert wrong == []


def test_free_and_live_default_to_the_current_time():
    job = JobFactory(status=JobStatus.QUEUED)
    past = make_binding(job, "idempotency", timezone.now() - timedelta(seconds=1), 1)
    future = make_binding(job, "idempotency", timezone.now() + timedelta(hours=1), 2)
    assert list(IdempotencyBinding.objects.free()) == [past]
    assert list(IdempotencyBinding.objects.live()) == [future]


def test_the_liveness_rule_names_every_mode_and_the_terminal_statuses_of_the_model():
    assert set(FREED_BY) == {mode.value for mode in KeyMode}
    assert set(TERMINAL_JOB_STATUSES) == set(TERMINAL_STATUSES)


@pytest.mark.parametrize("model", [IdempotencyBinding, EffectRecord])
def test_bindings_and_effects_take_their_key_columns_and_display_from_one_base(model):
    assert issubclass(model, HashedKey)
    assert [field.name for field in model._meta.fields[1:4]] == ["scope", "key_hash", "key_preview"]
    hashed = hashlib.sha256(b"orders\x1fk-1").digest()
    row = model(scope="orders", key_hash=hashed, key_preview="k-1•")
    assert row.key_digest == key_digest(hashed) == hashed.hex()[:12]
    assert str(row) == f"orders:k-1• [{hashed.hex()[:12]}]"


def make_children(job: Job, other: Job, n: int) -> None:
    """Give ``job`` one row of every kind that references it (a redrive from each side)."""
    now = timezone.now()
    make_binding(job, "unique", None, n)
    JobEvent.objects.create(job=job, kind="enqueued", at=now)
    Checkpoint.objects.create(job=job, name="stage", value=1, attempt=1, created_at=now)
    Redrive.objects.create(source=job, request_id=f"out-{n}", new_job=other, created_at=now)
    Redrive.objects.create(source=other, request_id=f"in-{n}", new_job=job, created_at=now)


def children_of(job_ids: list[int]) -> dict[str, int]:
    """Count the rows of each child table that still reference one of ``job_ids``."""
    return {
        "bindings": IdempotencyBinding.objects.filter(job_id__in=job_ids).count(),
        "events": JobEvent.objects.filter(job_id__in=job_ids).count(),
        "checkpoints": Checkpoint.objects.filter(job_id__in=job_ids).count(),
        "redrives": Redrive.objects.filter(Q(source_id__in=job_ids) | Q(new_job_id__in=job_ids)).count(),
    }


NO_CHILDREN = {"bindings": 0, "events": 0, "checkpoints": 0, "redrives": 0}


def test_deleting_jobs_through_the_orm_leaves_no_orphan_in_one_statement():
    doomed, kept = JobFactory(status=JobStatus.DEAD), JobFactory(status=JobStatus.QUEUED)
    make_children(doomed, kept, 1)
    JobEvent.objects.create(job=kept, kind="enqueued", at=timezone.now())
    with CaptureQueriesContext(connection) as queries:
        Job.objects.filter(pk=doomed.pk).delete()
    assert [query["sql"].split()[0] for query in queries] == ["DELETE"]
    assert children_of([doomed.pk]) == NO_CHILDREN
    assert Job.objects.filter(pk=kept.pk).exists()
    assert JobEvent.objects.filter(job=kept).count() == 1  # the survivor keeps its own history


@pytest.mark.parametrize("status", [JobStatus.QUEUED, JobStatus.SUCCEEDED])
def test_purge_and_prune_delete_jobs_with_every_kind_of_child_row(status):
    job, other = JobFactory(status=status, finished_at=timezone.now() - timedelta(days=30)), JobFactory()
    make_children(job, other, 2)
    if status == JobStatus.QUEUED:
        assert sql.housekeeping.purge_queued("default", queue=None, job_ids=[job.pk]) == 1
    else:
        assert sql.housekeeping.prune_finished_jobs(
            "default", before=timezone.now(), results_before=timezone.now(), limit=10
        ) == (1, None)
    assert not Job.objects.filter(pk=job.pk).exists()
    assert children_of([job.pk]) == NO_CHILDREN


@pytest.mark.parametrize(
    ("parent", "tables"),
    [
        (
            "workhorse_job",
            [
                "workhorse_binding",
                "workhorse_checkpoint",
                "workhorse_job_dependency",  # child_id
                "workhorse_job_dependency",  # parent_id
                "workhorse_job_event",
                "workhorse_redrive",
                "workhorse_redrive",
            ],
        ),
        ("workhorse_workflow", ["workhorse_job"]),  # a workflow's steps (migration 0021)
    ],
)
def test_every_child_foreign_key_cascades_in_the_database_and_stays_deferrable(parent, tables):
    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT conrelid::regclass::text, confdeltype, condeferrable, condeferred, convalidated
            FROM pg_constraint WHERE contype = 'f' AND confrelid = %s::regclass ORDER BY 1, conname""",
            [parent],
        )
        rows = cursor.fetchall()
    assert rows == [(table, "c", True, True, True) for table in tables]
