"""The driver's floor under django-workhorse's enqueue: the statements ``enqueue()`` sends, run by
psycopg alone in a loop (W1 and W5 only; copied beside the harness's bench.py by run.sh).

Each producer opens its own autocommit psycopg connection and builds, once, the parameters of the
statement our enqueue would send: for W1 the unkeyed single enqueue (one INSERT of one job, its
NOTIFY), for W5 the keyed function call (``workhorse_enqueue_one``) of every key the workloads use.
Each call then only executes that prepared statement with those parameters and reads its row:
no validation, no canonical JSON, no digests, no Django. What is left is the driver and the
server, the least any client of these statements pays; our own producer (``workhorse``) minus this
is what our Python costs per call.
"""

from __future__ import annotations

from typing import Any

from peer_workhorse import SAME_REQUEST, WorkhorseAdapter

# The keys bench.py's W5 uses: one replayed key, and the race's keys.
W5_KEYS = ("w5-key", *(f"race-{k}" for k in range(100)))


def statements(keys: tuple[str, ...] = W5_KEYS) -> tuple[str, dict[str, Any], str, dict[str, dict[str, Any]]]:
    """The unkeyed single enqueue and the keyed function call, with their parameters (payload
    ``SAME_REQUEST``): ``(unkeyed statement, its params, keyed statement, params by key)``."""
    from django_workhorse import EnqueueOptions, Idempotency
    from django_workhorse.conf import app_settings
    from django_workhorse.enqueueing.validation import prepare
    from django_workhorse.sql import enqueue as enqueue_sql
    from django_workhorse.sql.enqueue_rows import function_params, one_request_params

    channel = app_settings.NOTIFY_CHANNEL
    unkeyed = one_request_params((0, prepare("noop", SAME_REQUEST, EnqueueOptions())), channel)
    keyed = {
        key: function_params(0, prepare("noop", SAME_REQUEST, EnqueueOptions(idempotency=Idempotency(key))), channel)
        for key in keys
    }
    return enqueue_sql.ENQUEUE_ONE_UNKEYED, unkeyed, enqueue_sql.ENQUEUE_ONE, keyed


class Client:
    def __init__(self, dsn: str) -> None:
        import psycopg

        self.unkeyed, self.unkeyed_params, self.keyed, self.keyed_params = statements()
        self.conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0)

    def enqueue_one(self, payload: Any, task: str = "noop") -> None:
        self.conn.execute(self.unkeyed, self.unkeyed_params, prepare=True).fetchone()

    def enqueue_batch(self, payloads: Any) -> None:
        raise NotImplementedError  # batch_mode is None: W2 is not run

    def enqueue_unique(self, key: str, payload: Any) -> bool:
        row = self.conn.execute(self.keyed, self.keyed_params[key], prepare=True).fetchone()
        assert row is not None
        return bool(row[2])  # (ordinal, job_id, accepted, ...)

    def close(self) -> None:
        self.conn.close()


class WorkhorseFloorAdapter(WorkhorseAdapter):
    name = "workhorse_floor"
    notes = (
        "the floor: enqueue()'s statements (the unkeyed INSERT; the keyed workhorse_enqueue_one) run by psycopg "
        "alone, prepared, parameters built once; W1 and W5 only"
    )
    batch_mode = None

    def open_client(self) -> Client:
        return Client(self.dsn)


ADAPTER = WorkhorseFloorAdapter
