"""The asyncpg floor under django-workhorse's enqueue: the statements ``peer_workhorse_floor`` runs
with psycopg, run by asyncpg (pgqueuer's driver) in one event loop, prepared, parameters built
once (W1 and W5 only; copied beside the harness's bench.py by run.sh).

The two floors side by side say how much of a difference to pgqueuer is the driver's and how much
is ours.
"""

from __future__ import annotations

import re
from typing import Any

from peer_workhorse import WorkhorseAdapter
from peer_workhorse_floor import statements

_NAMED = re.compile(r"%\((\w+)\)s")


def positional(statement: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
    """``statement`` with its ``%(name)s`` placeholders as asyncpg's ``$n``, and the values in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return _NAMED.sub(number, statement), [params[name] for name in names]


class Client:
    """One asyncpg connection; asyncpg prepares each statement on its first use and keeps it (its
    statement cache), as pgqueuer's calls are prepared. Not prepared at open: a statement prepared
    but not yet run holds its tables' locks until it runs, and the harness empties the tables then."""

    def __init__(self, conn: Any, unkeyed: tuple[str, list[Any]], keyed: dict[str, tuple[str, list[Any]]]):
        self.conn, self.unkeyed, self.keyed = conn, unkeyed, keyed

    @classmethod
    async def open(cls, dsn: str) -> Client:
        import asyncpg

        unkeyed, unkeyed_params, keyed, keyed_params = statements()
        by_key = {key: positional(keyed, params) for key, params in keyed_params.items()}
        return cls(await asyncpg.connect(dsn), positional(unkeyed, unkeyed_params), by_key)

    async def enqueue_one(self, payload: Any, task: str = "noop") -> None:
        statement, args = self.unkeyed
        await self.conn.fetchrow(statement, *args)

    async def enqueue_batch(self, payloads: Any) -> None:
        raise NotImplementedError  # batch_mode is None: W2 is not run

    async def enqueue_unique(self, key: str, payload: Any) -> bool:
        statement, args = self.keyed[key]
        row = await self.conn.fetchrow(statement, *args)
        return bool(row[2])  # (ordinal, job_id, accepted, ...)

    async def close(self) -> None:
        await self.conn.close()


class WorkhorseFloorAsyncpgAdapter(WorkhorseAdapter):
    name = "workhorse_floor_asyncpg"
    is_async = True
    notes = "the floor through asyncpg: enqueue()'s statements, prepared, parameters built once; W1 and W5 only"
    batch_mode = None

    async def open_client(self) -> Client:
        return await Client.open(self.dsn)


ADAPTER = WorkhorseFloorAsyncpgAdapter
