"""What payload encryption at rest costs (decision 0024): enqueue and the worker with every job
encrypted against none, in one run, and how fast ``workhorse_rekey`` re-encrypts.

    python benchmarks/encryption.py [--n 5000] [--runs 5] [--rekey-rows 10000] [--json out.json]

Two sides, measured in the same process, alternating (off then on, then on then off in the next
round, so the machine's drift falls on both alike), each measurement on emptied tables:

- **off**: ``WORKHORSE_ENCRYPTION`` unset, what a project without encryption runs;
- **on**: ``WORKHORSE_ENCRYPTION`` set with freshly generated keys and ``encrypt_all``, through
  ``override_settings`` (the keys are parsed again when ``setting_changed`` says the setting changed).

Workloads, each with a 200-byte JSON payload (an order: an email, an address, an amount):

- W1 keyed: ``--n`` enqueues, one transaction each (``transaction.atomic()``), each with a new
  ``Idempotency`` key, as a view would enqueue;
- W2: ``--n`` jobs with ``enqueue_many``, 500 per call (one statement each);
- worker: ``--n`` no-op jobs enqueued (in the side's mode, untimed), then one burst worker in this
  process (8 threads, batch 50) until none is left; jobs/s over the worker's run.

After every measurement the stored jobs are checked: on, every payload (and after the worker every
result) is an envelope (``wh1:...``) and every job has a ``cipher_salt``; off, none is sealed.
Reported per side: median and [min-max]; the ratio of the medians (on / off) and the median of the
per-round ratios, against the issue's target (at most 10% slower).

Then the CPU the encryption adds, without the database: ``prepare`` of a keyed request, the seal
and the opening of one payload (microseconds, medians of alternating rounds).

Rekey: ``--rekey-rows`` jobs enqueued and run under key A (payload and result sealed: two values a
row), then key B made active (A kept) and ``operations.rekey.rekey(batch=--rekey-batch)`` timed;
values/s and rows/s. It rotates back and forth ``--runs`` times (B to A, A to B, ...), with a
``VACUUM`` of the jobs before each; after each, a census (``workhorse_rekey --dry-run``'s) must
show nothing under the previous key.

Uses DATABASE_URL, or the embedded PostgreSQL (database ``workhorse_bench``).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from common import (
    alternating_values,
    dump,
    environment,
    fill,
    rate,
    reset_tables,
    run_worker,
    setup_django,
)

# 200 bytes once serialized (canonical JSON, as it is stored and sealed; main() checks it).
ORDER = {
    "order_id": 48213,
    "email": "jane.doe@example.com",
    "amount": "129.90",
    "currency": "EUR",
    "address": {"name": "Jane Doe", "street": "12 Rue des Lilas", "city": "Lyon", "postcode": "69003", "country": "FR"},
    "items": 3,
}
W2_PER_CALL = 500
CONCURRENCY, BATCH = 8, 50
TARGET = 0.10  # the issue's bound: at most 10% slower with every job encrypted
SIDES = ("off", "on")
KEY_A, KEY_B = "bench-a", "bench-b"


def new_key() -> str:
    """A fresh key as the setting takes it: standard base64 of 32 random bytes."""
    return base64.b64encode(os.urandom(32)).decode()


def encryption_setting(keys: dict[str, str], active: str, fingerprint_key: str) -> dict[str, Any]:
    return {"keys": keys, "active": active, "fingerprint_key": fingerprint_key, "encrypt_all": True}


def sealed_counts() -> dict[str, int]:
    """How many stored jobs there are, how many have a salt, a sealed payload, a result, a sealed result."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT count(*), count(cipher_salt), count(*) FILTER (WHERE payload #>> '{}' LIKE 'wh1:%%'),
                      count(result), count(*) FILTER (WHERE result #>> '{}' LIKE 'wh1:%%')
               FROM workhorse_job"""
        )
        jobs, salted, payloads, results, sealed_results = cursor.fetchone()
    return {
        "jobs": jobs,
        "salted": salted,
        "sealed payloads": payloads,
        "results": results,
        "sealed results": sealed_results,
    }


def check_stored(side: str, n: int, *, ran: bool) -> None:
    """Assert the jobs of a measurement are stored as its side says: all sealed (on) or none (off)."""
    counts = sealed_counts()
    sealed = n if side == "on" else 0
    expected = {"jobs": n, "salted": sealed, "sealed payloads": sealed}
    if ran:
        expected["sealed results"] = sealed
        if side == "on":
            expected["results"] = n  # a no-op's None is sealed too
    assert {name: counts[name] for name in expected} == expected, (side, counts, expected)


def stored_payload_bytes() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT octet_length(payload::text) FROM workhorse_job LIMIT 1")
        return int(cursor.fetchone()[0])


def figure(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def micro_costs(rounds: int, per_round: int, on: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Microseconds per call of the CPU the encryption adds, without the database, alternating."""
    from django.test import override_settings

    from django_workhorse import EnqueueOptions, Idempotency
    from django_workhorse.encryption.jobs import PAYLOAD, new_salt, open_value, seal_value
    from django_workhorse.enqueueing.fingerprints import canonical_json
    from django_workhorse.enqueueing.validation import prepare

    text = canonical_json(ORDER)

    def per_call(work: Callable[[int], Any], setting: dict[str, Any] | None) -> Callable[[], float]:
        def measure() -> float:
            with override_settings(WORKHORSE_ENCRYPTION=setting):
                work(0)  # the keys parsed, outside the timing
                began = time.perf_counter()
                for i in range(per_round):
                    work(i)
                return (time.perf_counter() - began) / per_round * 1e6

        return measure

    prefix = uuid.uuid4().hex

    def keyed_prepare(i: int) -> Any:
        return prepare("bench.noop", ORDER, EnqueueOptions(idempotency=Idempotency(f"{prefix}{i}")))

    with override_settings(WORKHORSE_ENCRYPTION=on):
        salt = new_salt()
        envelope = seal_value(text, field=PAYLOAD, salt=salt)
        assert open_value(envelope, field=PAYLOAD, salt=salt, job_id=None) == text
    measures = {
        "prepare, keyed, off": per_call(keyed_prepare, None),
        "prepare, keyed, on": per_call(keyed_prepare, on),
        "seal one payload": per_call(lambda i: seal_value(text, field=PAYLOAD, salt=salt), on),
        "open one payload": per_call(lambda i: open_value(envelope, field=PAYLOAD, salt=salt, job_id=None), on),
    }
    return {label: figure(values) for label, values in alternating_values(rounds, measures).items()}


def rekey_rates(rows: int, runs: int, batch: int, fingerprint_key: str) -> dict[str, Any]:
    """Seal ``rows`` jobs' payloads and results under key A, then time ``rekey`` rotating between A and B."""
    from django.db import connection
    from django.test import override_settings

    from django_workhorse.operations.rekey import key_counts, rekey

    keys = {KEY_A: new_key(), KEY_B: new_key()}
    reset_tables()
    with override_settings(WORKHORSE_ENCRYPTION=encryption_setting({KEY_A: keys[KEY_A]}, KEY_A, fingerprint_key)):
        fill(rows, payload=ORDER)
        _, done = run_worker(CONCURRENCY, BATCH)
        assert done == rows, done
    check_stored("on", rows, ran=True)
    seconds: list[float] = []
    values = 0
    for i in range(runs):
        old, active = (KEY_A, KEY_B) if i % 2 == 0 else (KEY_B, KEY_A)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE workhorse_job")
        with override_settings(WORKHORSE_ENCRYPTION=encryption_setting(keys, active, fingerprint_key)):
            began = time.perf_counter()
            reports = rekey(batch=batch)
            seconds.append(time.perf_counter() - began)
            counts = key_counts()
        values = sum(report.rekeyed for report in reports)
        assert values == 2 * rows, reports  # each job's payload and result
        assert not any(report.unopened or report.locked for report in reports), reports
        assert all(old not in by_key for by_key in counts.values()), counts
        assert counts["workhorse_job"] == {active: 2 * rows}, counts
    return {
        "rows": rows,
        "values": values,
        "batch": batch,
        "seconds": figure(seconds),
        "values_per_s": figure([values / s for s in seconds]),
        "rows_per_s": figure([rows / s for s in seconds]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=5000, help="jobs per measurement")
    parser.add_argument("--runs", type=int, default=5, help="rounds (each side once per round)")
    parser.add_argument("--rekey-rows", type=int, default=10_000, help="jobs re-encrypted by each rekey")
    parser.add_argument("--rekey-batch", type=int, default=None, help="rekey's batch (default: workhorse_rekey's)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    setup_django()

    from django.db import transaction
    from django.test import override_settings

    from django_workhorse import Idempotency, enqueue, register
    from django_workhorse.encryption import is_configured
    from django_workhorse.enqueueing.fingerprints import canonical_json
    from django_workhorse.operations.rekey import DEFAULT_BATCH

    register("bench.noop", lambda payload: None)
    n = args.n
    payload_bytes = len(canonical_json(ORDER).encode())
    assert payload_bytes == 200, payload_bytes
    fingerprint_key = new_key()
    on = encryption_setting({KEY_A: new_key()}, KEY_A, fingerprint_key)
    settings = {"off": None, "on": on}

    def w1_keyed() -> float:
        prefix = uuid.uuid4().hex

        def work() -> None:
            for i in range(n):
                with transaction.atomic():
                    enqueue("bench.noop", ORDER, idempotency=Idempotency(f"{prefix}{i}"))

        return rate(n, work)

    def w2() -> float:
        return rate(n, lambda: fill(n, payload=ORDER, per_call=W2_PER_CALL))

    def worker() -> float:
        fill(n, payload=ORDER)
        seconds, done = run_worker(CONCURRENCY, BATCH)
        assert done == n, done
        return n / seconds

    envelope_bytes: dict[str, int] = {}

    def measure(side: str, workload: Callable[[], float], ran: bool) -> float:
        reset_tables()
        with override_settings(WORKHORSE_ENCRYPTION=settings[side]):
            assert is_configured() is (side == "on")  # the keys were forgotten when the setting changed
            value = workload()
        check_stored(side, n, ran=ran)
        envelope_bytes.setdefault(side, stored_payload_bytes())
        return value

    workloads = {
        "W1: enqueue, keyed, 1 per transaction": (w1_keyed, False),
        f"W2: enqueue_many({W2_PER_CALL})": (w2, False),
        f"worker: {CONCURRENCY} threads, batch {BATCH}, no-op": (worker, True),
    }
    print(
        f"payload {payload_bytes} bytes of JSON; n {n}, {args.runs} rounds; "
        f"measuring (load average before: {os.getloadavg()[0]:.2f})",
        flush=True,
    )
    values: dict[str, dict[str, list[float]]] = {label: {side: [] for side in SIDES} for label in workloads}
    for round_ in range(args.runs):  # every workload in the round, each off and on in the round's order
        for label, (workload, ran) in workloads.items():
            for side in SIDES if round_ % 2 == 0 else reversed(SIDES):
                values[label][side].append(measure(side, workload, ran))
        print(f"round {round_ + 1}/{args.runs} done (load average {os.getloadavg()[0]:.2f})", flush=True)
    load_after = os.getloadavg()

    figures: dict[str, dict[str, Any]] = {}
    for label, by_side in values.items():
        off, on_ = by_side["off"], by_side["on"]
        pair_ratios = [b / a for a, b in zip(off, on_, strict=True)]
        medians_ratio = statistics.median(on_) / statistics.median(off)
        figures[label] = {
            "off": {**figure(off), "values": off},
            "on": {**figure(on_), "values": on_},
            "ratio_of_medians": medians_ratio,
            "pair_ratios": pair_ratios,
            "median_pair_ratio": statistics.median(pair_ratios),
            "target_met": statistics.median(pair_ratios) >= 1 - TARGET and medians_ratio >= 1 - TARGET,
        }

    micro = micro_costs(max(args.runs, 5) * 2, 2000, on)
    rekey = rekey_rates(args.rekey_rows, args.runs, args.rekey_batch or DEFAULT_BATCH, fingerprint_key)

    env = environment()
    print("\n" + json.dumps(env))
    print(f"load average after the A/B rounds: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    print(
        f"payload: {payload_bytes} bytes of JSON; stored: {envelope_bytes['off']} bytes in clear, "
        f"{envelope_bytes['on']} bytes sealed (the envelope as a JSON string)"
    )
    print(
        f"\n### encryption off vs encrypt_all on ({n:,} jobs, {args.runs} rounds, alternating)\n\n"
        "| workload | off, jobs/s | on, jobs/s | on / off (medians) | on / off (median of pairs) | ≤ 10% slower |\n"
        "|---|---|---|---|---|---|"
    )
    for label, f in figures.items():
        off, on_ = f["off"], f["on"]
        print(
            f"| {label} | **{off['median']:,.0f}** [{off['min']:,.0f}-{off['max']:,.0f}] | "
            f"**{on_['median']:,.0f}** [{on_['min']:,.0f}-{on_['max']:,.0f}] | {f['ratio_of_medians']:.3f} | "
            f"{f['median_pair_ratio']:.3f} ({min(f['pair_ratios']):.2f}-{max(f['pair_ratios']):.2f}) | "
            f"{'yes' if f['target_met'] else 'no'} |"
        )
    print("\nwithout the database, µs per call (median [min-max] of alternating rounds):")
    for label, stats in micro.items():
        print(f"- {label}: {stats['median']:.1f} µs [{stats['min']:.1f}-{stats['max']:.1f}]")
    print(
        f"\nrekey: {rekey['rows']:,} jobs, {rekey['values']:,} values (payload and result), batch {rekey['batch']}, "
        f"{args.runs} rotations: median {rekey['seconds']['median']:.2f} s "
        f"[{rekey['seconds']['min']:.2f}-{rekey['seconds']['max']:.2f}], "
        f"{rekey['values_per_s']['median']:,.0f} values/s [{rekey['values_per_s']['min']:,.0f}-"
        f"{rekey['values_per_s']['max']:,.0f}], {rekey['rows_per_s']['median']:,.0f} rows/s"
    )
    dump(
        args.json,
        {
            "environment": env,
            "load_average_after_rounds": load_after,
            "n": n,
            "runs": args.runs,
            "payload_bytes": payload_bytes,
            "stored_payload_bytes": envelope_bytes,
            "worker": {"concurrency": CONCURRENCY, "batch": BATCH},
            "target_max_slowdown": TARGET,
            "figures": figures,
            "micro_us": micro,
            "rekey": rekey,
        },
    )


if __name__ == "__main__":
    main()
