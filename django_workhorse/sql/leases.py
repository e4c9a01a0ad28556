"""Named leases (workhorse_lease): one holder at a time, taken by compare and swap on a row.

A lease is a row, not a session advisory lock, so it means the same through a transaction pooler
(PgBouncer in transaction mode hands a server session to another client after each transaction,
and a session lock would go with it): each statement below is a transaction of its own when the
caller's connection is in autocommit mode, and none of them waits for another holder.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from django_workhorse.sql.connection import execute, run

# take_lease: take lease %(name)s for %(holder)s until now + %(ttl)s if it is free (never taken,
# given back, or expired), in one statement; returns one row when taken. Only a free row is
# locked, with SKIP LOCKED: a lease that another session is taking or renewing right now is busy,
# this statement never waits for it, and a live lease is not locked at all (a caller's open
# transaction that found it taken holds nothing). A lease never taken (or whose row was deleted) is inserted; two
# sessions inserting it at once are settled by the primary key (ON CONFLICT DO NOTHING).
TAKE_LEASE = """
WITH free AS MATERIALIZED (
    SELECT name FROM workhorse_lease
    WHERE name = %(name)s AND expires_at <= clock_timestamp()
    FOR UPDATE SKIP LOCKED
),
taken AS (
    UPDATE workhorse_lease AS lease
    SET holder = %(holder)s::uuid, expires_at = clock_timestamp() + %(ttl)s
    FROM free
    WHERE lease.name = free.name
    RETURNING lease.name
),
created AS (
    INSERT INTO workhorse_lease (name, holder, expires_at)
    SELECT %(name)s::text, %(holder)s::uuid, clock_timestamp() + %(ttl)s::interval
    WHERE NOT EXISTS (SELECT 1 FROM workhorse_lease WHERE name = %(name)s::text)
    ON CONFLICT (name) DO NOTHING
    RETURNING name
)
SELECT name FROM taken UNION ALL SELECT name FROM created
"""


# renew_lease: push the expiry of a lease %(holder)s still holds; no row when it lost the lease
# (it expired and someone else took it). The primary key finds the row.
RENEW_LEASE = """
UPDATE workhorse_lease SET expires_at = clock_timestamp() + %(ttl)s
WHERE name = %(name)s AND holder = %(holder)s AND expires_at > clock_timestamp()
RETURNING name
"""


# give_back_lease: free a lease %(holder)s holds (a lost one is left to its new holder).
GIVE_BACK_LEASE = """
UPDATE workhorse_lease SET expires_at = clock_timestamp()
WHERE name = %(name)s AND holder = %(holder)s AND expires_at > clock_timestamp()
"""


def take_lease(alias: str, name: str, ttl: timedelta) -> uuid.UUID | None:
    """Run TAKE_LEASE with a new holder token; return the token if the lease was taken, else None."""
    holder = uuid.uuid4()
    rows = execute(alias, TAKE_LEASE, {"name": name, "holder": holder, "ttl": ttl})
    return holder if rows else None


def renew_lease(alias: str, name: str, holder: uuid.UUID, ttl: timedelta) -> bool:
    """Run RENEW_LEASE; return whether ``holder`` still holds the lease."""
    return bool(execute(alias, RENEW_LEASE, {"name": name, "holder": holder, "ttl": ttl}))


def give_back_lease(alias: str, name: str, holder: uuid.UUID) -> None:
    """Run GIVE_BACK_LEASE."""
    run(alias, GIVE_BACK_LEASE, {"name": name, "holder": holder})
