"""django-workhorse, for the peer benchmark harness (copied beside its bench.py by run.sh).

Producer: ``enqueue("noop", payload)`` outside a transaction, so the one statement commits on its
own, as the other peers' producers do; the ``workhorse_atomic`` variant wraps every call in
``transaction.atomic()`` as a Django view would (BEGIN and COMMIT are two more round trips).
Batch: ``enqueue_many`` of 500 requests (one statement). Worker: ``manage.py workhorse_worker``
via call_command, waking on LISTEN/NOTIFY; ``WORKHORSE_BATCH`` (50) sets ``--batch``, the jobs
claimed per round trip; outcomes are written fenced, whatever has accumulated in one statement.
Dedup:
``Idempotency(key)``; every repeat of a key sends the same payload, because this mode treats a
changed payload under a live key as a conflict (an error), not as a duplicate.
"""

from __future__ import annotations

import importlib.metadata as md
import os

from adapter_base import Adapter, make_payload, probe_hit

SAME_REQUEST = make_payload(0)
BATCH = int(os.environ.get("WORKHORSE_BATCH", "50"))


def register_handlers():
    from django_workhorse import register

    register("noop", lambda payload: None)
    register("probe", lambda payload: probe_hit(payload["i"]))


class Client:
    def __init__(self, atomic: bool, keyed: bool = False):
        import itertools
        import uuid
        from contextlib import nullcontext

        from django.db import connection, transaction

        self.transaction = transaction.atomic if atomic else nullcontext
        # The keyed variants give every W1 job a new idempotency key (a first request, never a replay).
        self.new_keys = (f"{uuid.uuid4().hex}-{i}" for i in itertools.count()) if keyed else None
        # Connect now, as the other peers' clients do when they are opened: the harness gives every
        # producer time to connect before the race starts.
        connection.ensure_connection()

    def enqueue_one(self, payload, task="noop"):
        from django_workhorse import Idempotency, enqueue

        key = None if self.new_keys is None else Idempotency(next(self.new_keys))
        with self.transaction():
            enqueue(task, payload, idempotency=key)

    def enqueue_batch(self, payloads):
        from django_workhorse import EnqueueRequest, enqueue_many

        with self.transaction():
            enqueue_many([EnqueueRequest("noop", p) for p in payloads])

    def enqueue_unique(self, key, payload):
        from django_workhorse import EnqueueOutcome, Idempotency, enqueue_with_result

        with self.transaction():
            result = enqueue_with_result("noop", SAME_REQUEST, idempotency=Idempotency(key))
        return result.outcome == EnqueueOutcome.ACCEPTED

    def close(self):
        from django.db import connection

        connection.close()


class WorkhorseAdapter(Adapter):
    name = "workhorse"
    atomic = False
    keyed = False
    notes = (
        "django-workhorse: enqueue() in autocommit (one prepared statement: a keyed request calls "
        "workhorse_enqueue_one, which looks the key up and only then writes binding + job + NOTIFY; "
        "an unkeyed one is one INSERT); W2 enqueue_many(500), one statement; W5 Idempotency(key) with the same request "
        "per key; CONN_MAX_AGE=None; worker = workhorse_worker (LISTEN/NOTIFY, threads, batch claims, "
        "one fenced outcome statement per job)"
    )
    w3_configs = {
        "c1": {"procs": 1, "concurrency": 1, "desc": f"1 proc, concurrency=1, batch={BATCH}"},
        "cN": {"procs": 1, "concurrency": 8, "desc": f"1 proc, concurrency=8 threads, batch={BATCH}"},
        "cNx2": {"procs": 2, "concurrency": 8, "desc": f"2 procs x concurrency=8, batch={BATCH}"},
    }
    batch_mode = "bulk"
    dedup_mode = (
        "Idempotency(key): unique (scope, key_hash) binding; a lookup first, then INSERT .. ON CONFLICT DO NOTHING"
    )
    unfinished_sql = "SELECT count(*) FROM workhorse_job WHERE status IN ('queued', 'running')"
    total_jobs_sql = "SELECT count(*) FROM workhorse_job"
    succeeded_sql = "SELECT count(*) FROM workhorse_job WHERE status = 'succeeded'"
    job_tables = ("workhorse_job",)

    def __init__(self, dsn):
        super().__init__(dsn)
        os.environ["PEERBENCH_DSN"] = dsn
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "wbench.settings")
        import django

        django.setup()

    def versions(self):
        return {
            "django": md.version("django"),
            "django-workhorse": md.version("django-workhorse"),
            "psycopg": md.version("psycopg"),
        }

    def setup(self):
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)

    def reset(self):
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE workhorse_job CASCADE")

    def open_client(self):
        return Client(self.atomic, self.keyed)

    def prepare_worker(self, concurrency):
        register_handlers()
        from django_workhorse.management.commands import workhorse_worker  # noqa: F401 (import before GO)

    def run_worker(self, concurrency):
        from django.core.management import call_command

        call_command("workhorse_worker", concurrency=concurrency, batch=BATCH, verbosity=0)


ADAPTER = WorkhorseAdapter
