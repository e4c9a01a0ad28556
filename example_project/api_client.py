"""A client of the shop's JSON API that loses a response and retries with the same Idempotency-Key.

    python example_project/api_client.py [--url http://127.0.0.1:8000] [--invoice ID]

1. ``POST /api/orders/`` with a new key, then a lost answer: the client waits until the shop
   starts answering and hangs up without reading it, as a client whose read timed out just then
   does. The shop placed the order anyway.
2. The retry, with the same key and body, gets the same order back (``Idempotent-Replayed: true``).
   A retry that arrives while its first request still runs waits for it on the server (the views'
   ``wait=``), and a 409 after that wait is retried after its ``Retry-After``.
3. The same key with another body gets a 422 naming the part that differs.
4. With ``--invoice``, the same for ``POST /api/invoices/<id>/capture/``.

Standard library only; prints what it sends and gets.
"""

from __future__ import annotations

import argparse
import http.client
import json
import select
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

MAX_TRIES = 5
TIMEOUT = 30


def send(url: str, path: str, body: Any, key: str, *, read: bool = True) -> tuple[int, dict[str, str], Any]:
    """POST ``body`` as JSON with ``Idempotency-Key: "<key>"``.

    With ``read=False`` the answer is lost: wait until it starts to arrive, then hang up unread.
    """
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=TIMEOUT)
    headers = {"Content-Type": "application/json", "Idempotency-Key": f'"{key}"'}
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        if not read:
            # Waiting for the first byte puts the retry after this request for certain: were it
            # sent at once, it could overtake this one, run the view itself and print no replay.
            select.select([conn.sock], [], [], TIMEOUT)
            return 0, {}, None
        response = conn.getresponse()
        text = response.read()
        got = {name.lower(): value for name, value in response.getheaders()}
        return response.status, got, json.loads(text) if text else None
    finally:
        conn.close()


def retry(url: str, path: str, body: Any, key: str) -> tuple[int, dict[str, str], Any]:
    """Send until the answer is not a 409 (the first request still running), honouring Retry-After."""
    for _ in range(MAX_TRIES):
        status, headers, document = send(url, path, body, key)
        if status != 409 or "retry-after" not in headers:
            return status, headers, document
        print(f"  409, still running: retrying in {headers['retry-after']} s")
        time.sleep(float(headers["retry-after"]))
    return status, headers, document


def show(label: str, status: int, headers: dict[str, str], document: Any) -> None:
    replayed = headers.get("idempotent-replayed") == "true"
    print(f"{label}: {status}{' (replayed)' if replayed else ''} {json.dumps(document)}")


def scenario(url: str, path: str, body: Any, changed: Any) -> dict[str, Any]:
    key = str(uuid.uuid4())
    print(f"POST {path} with Idempotency-Key {key[:8]}…, then the answer is lost (hang up unread)")
    send(url, path, body, key, read=False)
    status, headers, first = retry(url, path, body, key)
    show("retry with the same key", status, headers, first)
    status_again, headers_again, again = retry(url, path, body, key)
    show("and once more", status_again, headers_again, again)
    conflict_status, conflict_headers, conflict = send(url, path, changed, key)
    show("same key, another body", conflict_status, conflict_headers, conflict)
    return {
        "retry": (status, headers, first),
        "again": (status_again, headers_again, again),
        "changed": (conflict_status, conflict),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--invoice", type=int, default=None, help="also capture this invoice")
    args = parser.parse_args(argv)
    outcomes = {
        "orders": scenario(
            args.url, "/api/orders/", {"product": "Ceramic mug", "quantity": 2}, {"product": "Ceramic mug"}
        )
    }
    if args.invoice is not None:
        path = f"/api/invoices/{args.invoice}/capture/"
        outcomes["capture"] = scenario(args.url, path, {}, {"amount": 1})
    return outcomes


if __name__ == "__main__":
    main()
