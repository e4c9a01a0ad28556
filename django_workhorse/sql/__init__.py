"""Every raw SQL statement of django-workhorse, and the thin functions that run them.

PostgreSQL-specific SQL lives in this package and nowhere else (a test enforces it), one module per
concern: ``enqueue``, ``claims`` (the worker), ``actions`` (operators), ``housekeeping``,
``effects`` (the ledger), with shared key fragments in ``keys`` and the plumbing in
``_connection``. Each statement is a named constant with a comment saying what it does and which
constraint or index it relies on. Parameters are always bound (``%(name)s``), never formatted in.
Callers use the names re-exported here (``from django_workhorse import sql; sql.claim(...)``).
"""

from __future__ import annotations

from django_workhorse.sql._connection import (
    LISTEN as LISTEN,
)
from django_workhorse.sql._connection import (
    _execute as _execute,
)
from django_workhorse.sql._connection import (
    constraint_name as constraint_name,
)
from django_workhorse.sql._connection import (
    listen as listen,
)
from django_workhorse.sql.actions import (
    CANCEL as CANCEL,
)
from django_workhorse.sql.actions import (
    FIND_REDRIVE as FIND_REDRIVE,
)
from django_workhorse.sql.actions import (
    REDRIVE as REDRIVE,
)
from django_workhorse.sql.actions import (
    RELEASE_BINDINGS as RELEASE_BINDINGS,
)
from django_workhorse.sql.actions import (
    RUN_NOW as RUN_NOW,
)
from django_workhorse.sql.actions import (
    cancel as cancel,
)
from django_workhorse.sql.actions import (
    find_redrive as find_redrive,
)
from django_workhorse.sql.actions import (
    redrive as redrive,
)
from django_workhorse.sql.actions import (
    release_bindings as release_bindings,
)
from django_workhorse.sql.actions import (
    run_now as run_now,
)
from django_workhorse.sql.claims import (
    CLAIM as CLAIM,
)
from django_workhorse.sql.claims import (
    CLAIM_ATTEMPTS as CLAIM_ATTEMPTS,
)
from django_workhorse.sql.claims import (
    CLAIM_JOB as CLAIM_JOB,
)
from django_workhorse.sql.claims import (
    CONCURRENCY_LOCK_CLASS as CONCURRENCY_LOCK_CLASS,
)
from django_workhorse.sql.claims import (
    DEADLOCK_DETECTED as DEADLOCK_DETECTED,
)
from django_workhorse.sql.claims import (
    EXTEND_LEASES as EXTEND_LEASES,
)
from django_workhorse.sql.claims import (
    LOAD_CHECKPOINT as LOAD_CHECKPOINT,
)
from django_workhorse.sql.claims import (
    RECLAIM_EXPIRED as RECLAIM_EXPIRED,
)
from django_workhorse.sql.claims import (
    RECORD_OUTCOMES as RECORD_OUTCOMES,
)
from django_workhorse.sql.claims import (
    RELEASE as RELEASE,
)
from django_workhorse.sql.claims import (
    SAVE_CHECKPOINT as SAVE_CHECKPOINT,
)
from django_workhorse.sql.claims import (
    USE_GENERIC_PLANS as USE_GENERIC_PLANS,
)
from django_workhorse.sql.claims import (
    ClaimedJob as ClaimedJob,
)
from django_workhorse.sql.claims import (
    claim as claim,
)
from django_workhorse.sql.claims import (
    claim_job as claim_job,
)
from django_workhorse.sql.claims import (
    extend_leases as extend_leases,
)
from django_workhorse.sql.claims import (
    load_checkpoint as load_checkpoint,
)
from django_workhorse.sql.claims import (
    reclaim_expired as reclaim_expired,
)
from django_workhorse.sql.claims import (
    record_outcomes as record_outcomes,
)
from django_workhorse.sql.claims import (
    release as release,
)
from django_workhorse.sql.claims import (
    save_checkpoint as save_checkpoint,
)
from django_workhorse.sql.effects import (
    CLAIM_EFFECT as CLAIM_EFFECT,
)
from django_workhorse.sql.effects import (
    FIND_EFFECT as FIND_EFFECT,
)
from django_workhorse.sql.effects import (
    PRUNE_EXPIRED_EFFECTS as PRUNE_EXPIRED_EFFECTS,
)
from django_workhorse.sql.effects import (
    STORE_EFFECT as STORE_EFFECT,
)
from django_workhorse.sql.effects import (
    TAKE_OVER_EFFECT as TAKE_OVER_EFFECT,
)
from django_workhorse.sql.effects import (
    EffectEntry as EffectEntry,
)
from django_workhorse.sql.effects import (
    claim_effect as claim_effect,
)
from django_workhorse.sql.effects import (
    find_effect as find_effect,
)
from django_workhorse.sql.effects import (
    prune_expired_effects as prune_expired_effects,
)
from django_workhorse.sql.effects import (
    store_effect as store_effect,
)
from django_workhorse.sql.effects import (
    take_over_effect as take_over_effect,
)
from django_workhorse.sql.enqueue import (
    ENQUEUE_MANY as ENQUEUE_MANY,
)
from django_workhorse.sql.enqueue import (
    ENQUEUE_MANY_UNKEYED as ENQUEUE_MANY_UNKEYED,
)
from django_workhorse.sql.enqueue import (
    ENQUEUE_ONE as ENQUEUE_ONE,
)
from django_workhorse.sql.enqueue import (
    ENQUEUE_ONE_UNKEYED as ENQUEUE_ONE_UNKEYED,
)
from django_workhorse.sql.enqueue import (
    FIND_BINDINGS as FIND_BINDINGS,
)
from django_workhorse.sql.enqueue import (
    REPLACE_DEBOUNCED as REPLACE_DEBOUNCED,
)
from django_workhorse.sql.enqueue import (
    TAKE_OVER as TAKE_OVER,
)
from django_workhorse.sql.enqueue import (
    EnqueueRows as EnqueueRows,
)
from django_workhorse.sql.enqueue import (
    ExistingBinding as ExistingBinding,
)
from django_workhorse.sql.enqueue import (
    enqueue_rows as enqueue_rows,
)
from django_workhorse.sql.enqueue import (
    find_bindings as find_bindings,
)
from django_workhorse.sql.enqueue import (
    replace_debounced as replace_debounced,
)
from django_workhorse.sql.enqueue import (
    take_over as take_over,
)
from django_workhorse.sql.housekeeping import (
    DEREGISTER_WORKER as DEREGISTER_WORKER,
)
from django_workhorse.sql.housekeeping import (
    MAINTENANCE_LOCK_KEY as MAINTENANCE_LOCK_KEY,
)
from django_workhorse.sql.housekeeping import (
    PRUNE_EXPIRED_BINDINGS as PRUNE_EXPIRED_BINDINGS,
)
from django_workhorse.sql.housekeeping import (
    PRUNE_FINISHED_JOBS as PRUNE_FINISHED_JOBS,
)
from django_workhorse.sql.housekeeping import (
    PRUNE_STALE_WORKERS as PRUNE_STALE_WORKERS,
)
from django_workhorse.sql.housekeeping import (
    PURGE_QUEUED as PURGE_QUEUED,
)
from django_workhorse.sql.housekeeping import (
    REGISTER_WORKER as REGISTER_WORKER,
)
from django_workhorse.sql.housekeeping import (
    RELEASE_MAINTENANCE_LOCK as RELEASE_MAINTENANCE_LOCK,
)
from django_workhorse.sql.housekeeping import (
    TOUCH_WORKER as TOUCH_WORKER,
)
from django_workhorse.sql.housekeeping import (
    TRY_MAINTENANCE_LOCK as TRY_MAINTENANCE_LOCK,
)
from django_workhorse.sql.housekeeping import (
    deregister_worker as deregister_worker,
)
from django_workhorse.sql.housekeeping import (
    maintenance_lock as maintenance_lock,
)
from django_workhorse.sql.housekeeping import (
    prune_expired_bindings as prune_expired_bindings,
)
from django_workhorse.sql.housekeeping import (
    prune_finished_jobs as prune_finished_jobs,
)
from django_workhorse.sql.housekeeping import (
    prune_stale_workers as prune_stale_workers,
)
from django_workhorse.sql.housekeeping import (
    purge_queued as purge_queued,
)
from django_workhorse.sql.housekeeping import (
    register_worker as register_worker,
)
from django_workhorse.sql.housekeeping import (
    touch_worker as touch_worker,
)
