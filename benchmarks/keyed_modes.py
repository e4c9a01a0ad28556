"""What each keyed mode costs per request, and debounce under contention, in one run.

    python benchmarks/keyed_modes.py [--n 2000] [--runs 3] [--producers 12] [--json out.json]

Uses DATABASE_URL, or the embedded PostgreSQL (database ``workhorse_bench``). Every request is its
own transaction (autocommit). Single-producer rows: new keys (one job each) and repeats of one key
(coalesced, replaced or replayed). Contention: --producers threads, each with its own connection,
send --n debounce requests for ONE key between them; requests/s over the whole run, and the check
that exactly one job exists afterwards.
"""

from __future__ import annotations

import argparse
import json
import threading
import uuid
from datetime import timedelta

from common import PAYLOAD, dump, environment, median_of, print_table, rate, reset_tables, setup_django

HOUR = timedelta(hours=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--producers", type=int, default=12)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    setup_django()

    from django.db import connections

    from django_workhorse import Debounce, Idempotency, Throttle, Unique, enqueue_with_result
    from django_workhorse.models import Job

    n = args.n
    modes = {
        "idempotency": lambda key: {"idempotency": Idempotency(key)},
        "unique": lambda key: {"unique": Unique(key)},
        "debounce": lambda key: {"debounce": Debounce(key, window=HOUR)},
        "throttle": lambda key: {"throttle": Throttle(key, window=HOUR)},
    }

    def fresh(measure):
        def run() -> float:
            reset_tables()
            return measure()

        return run

    def new_keys(mode: str) -> float:
        prefix = uuid.uuid4().hex
        return rate(n, lambda: [enqueue_with_result("noop", PAYLOAD, **modes[mode](f"{prefix}{i}")) for i in range(n)])

    def repeats(mode: str) -> float:
        options = modes[mode](uuid.uuid4().hex)
        enqueue_with_result("noop", PAYLOAD, **options)
        # Debounce repeats change the payload (the latest definition wins); the others repeat it.
        payload = (lambda i: {**PAYLOAD, "edit": i}) if mode == "debounce" else (lambda i: PAYLOAD)
        return rate(n, lambda: [enqueue_with_result("noop", payload(i), **options) for i in range(n)])

    def contended_debounce() -> float:
        key = Debounce(uuid.uuid4().hex, window=HOUR)
        barrier = threading.Barrier(args.producers)
        share = n // args.producers

        def produce(worker: int) -> None:
            barrier.wait()
            try:
                for i in range(share):
                    enqueue_with_result("noop", {**PAYLOAD, "producer": worker, "edit": i}, debounce=key)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=produce, args=(w,)) for w in range(args.producers)]

        def work() -> None:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

        measured = rate(share * args.producers, work)
        assert Job.objects.count() == 1, "debounce under contention must leave exactly one job"
        return measured

    runs = args.runs
    figures = {}
    for mode in modes:
        figures[f"{mode}, new key"] = median_of(runs, fresh(lambda mode=mode: new_keys(mode)))
        outcome = {"idempotency": "replayed", "debounce": "replaced"}.get(mode, "coalesced")
        figures[f"{mode}, same key again ({outcome})"] = median_of(runs, fresh(lambda mode=mode: repeats(mode)))
    figures[f"debounce, one key, {args.producers} producers (replaced)"] = median_of(runs, fresh(contended_debounce))
    env = environment()
    print("\n" + json.dumps(env))
    print_table("keyed enqueue, autocommit (requests/s)", [(k, v, "requests/s") for k, v in figures.items()])
    if args.json:
        dump(args.json, {"environment": env, "args": vars(args), "figures": figures})


if __name__ == "__main__":
    main()
