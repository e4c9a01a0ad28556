"""Keys and settings for the encryption tests, and the check that a text shows no key."""

from __future__ import annotations

import base64
import os
from typing import Any

ACTIVE = "2026-12"


def new_key(size: int = 32) -> str:
    """A fresh key as the setting takes it: standard base64, padded, of ``size`` random bytes."""
    return base64.b64encode(os.urandom(size)).decode()


def encryption_setting(**fields: Any) -> dict[str, Any]:
    """A valid WORKHORSE_ENCRYPTION with fresh keys (one, ``ACTIVE``), ``fields`` replacing its own."""
    return {"keys": {ACTIVE: new_key()}, "active": ACTIVE, "fingerprint_key": new_key(), **fields}


def assert_shows_no_key(text: str, *keys: str) -> None:
    """Assert ``text`` holds none of ``keys``: not as given, url-safe, in part, in hex or as bytes."""
    for key in keys:
        shown = [key, key[:20], key[-22:-2], key.replace("+", "-").replace("/", "_")]
        try:
            raw = base64.b64decode(key)
            shown += [raw.hex(), repr(raw)[2:-1]]
        except ValueError:
            pass
        for fragment in shown:
            assert fragment not in text, f"{fragment!r} shown in {text!r}"
