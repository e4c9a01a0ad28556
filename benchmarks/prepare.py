"""The Python cost of checking a request, without the database: ``validation.prepare()`` per call.

    python benchmarks/prepare.py [--n 40000] [--runs 5]

Times a keyed request (idempotency key and scope) and an unkeyed one with tags, each ``--n``
times per run, and prints the median µs per call over ``--runs`` runs. Run it from two checkouts
(same interpreter) to see what a change to the checks costs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = {
    "invoiceId": 12345,
    "customer": "ada@example.com",
    "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=40000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import django
    from django.conf import settings

    settings.configure(INSTALLED_APPS=["django_workhorse"], USE_TZ=True, DATABASES={})
    django.setup()
    from django_workhorse import Idempotency
    from django_workhorse.enqueueing.validation import prepare, resolve_options

    unkeyed = resolve_options(None, {"queue": "billing", "tags": ["a", "b"]})

    def keyed_call(i: int) -> None:
        key = Idempotency(key=f"capture:{i}", scope="invoice-capture")
        prepare("invoice.capture", PAYLOAD, resolve_options(None, {"queue": "billing", "idempotency": key}))

    def unkeyed_call(i: int) -> None:
        prepare("invoice.capture", PAYLOAD, unkeyed)

    for label, call in (("keyed", keyed_call), ("unkeyed", unkeyed_call)):
        per_call = []
        for _ in range(args.runs):
            start = time.perf_counter()
            for i in range(args.n):
                call(i)
            per_call.append((time.perf_counter() - start) / args.n * 1e6)
        print(
            f"{label}: median {statistics.median(per_call):.1f} µs per call [{min(per_call):.1f}-{max(per_call):.1f}]"
        )


if __name__ == "__main__":
    main()
