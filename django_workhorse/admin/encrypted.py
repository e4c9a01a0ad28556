"""Encrypted values on the admin's pages (decision 0024).

Whoever lacks ``workhorse.view_encrypted`` sees each encrypted value described, "encrypted (N bytes,
key K)"; whoever holds it (a superuser does) sees it opened, and each page view of an object whose
encrypted values were opened is recorded in the admin log ("Viewed encrypted values", a change
entry). A value that does not open is described with the reason; it never fails the page.

Lists, the dashboard and the actions' previews describe encrypted errors to every user: they are
lists of many jobs, and the log records a look at one object.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest, HttpResponse

from django_workhorse.encryption import described, sealed_json
from django_workhorse.encryption.jobs import SEALED_EVENT_DETAILS, is_sealed_text, open_value
from django_workhorse.exceptions import DecryptionError

from .base import has_permission
from .display import event_details, pretty_json

PERMISSION = "view_encrypted"
VIEWED = "Viewed encrypted values"
_REQUEST_ATTRIBUTE = "_workhorse_encrypted_values"


def may_view_encrypted(request: HttpRequest) -> bool:
    """Whether the request's user is active staff holding ``workhorse.view_encrypted``."""
    return has_permission(request, PERMISSION)


class EncryptedValues:
    """The encrypted values of one page: described, or opened when the user may view them.

    ``opened`` says whether any was shown in clear; ``shown`` is the object whose page it is (the
    admin log names it).
    """

    def __init__(self, *, allowed: bool) -> None:
        self.allowed = allowed
        self.opened = False
        self.shown: Model | None = None

    def job_text(self, stored: str, *, field: str, salt: bytes | None, job_id: int) -> str:
        """A job's stored text (``last_error``, an event's error): a clear job's, or text the library
        wrote in clear, as it is; an envelope described or opened."""
        if salt is None or not is_sealed_text(stored):
            return stored
        return self._opened(stored, lambda: open_value(stored, field=field, salt=salt, job_id=job_id))

    def job_json(self, stored: Any, *, field: str, salt: bytes | None, job_id: int, limit: int) -> str:
        """A job's stored JSON value (payload, result, a checkpoint), pretty-printed when shown."""
        if salt is None:
            return pretty_json(stored, limit)
        envelope = stored if isinstance(stored, str) else None
        return self._opened(
            envelope,
            lambda: pretty_json(json.loads(open_value(envelope or "", field=field, salt=salt, job_id=job_id)), limit),
        )

    def event_details(self, details: Any, *, salt: bytes | None, job_id: int) -> list[tuple[str, str]]:
        """An event's details as ``display.event_details`` gives them, its sealed texts described or opened."""
        if salt is None or not isinstance(details, dict):
            return event_details(details)
        shown = {
            name: self.job_text(value, field=f"event.{name}", salt=salt, job_id=job_id)
            if name in SEALED_EVENT_DETAILS and isinstance(value, str)
            else value
            for name, value in details.items()
        }
        return event_details(shown)

    def effect_json(self, stored: Any, *, associated_data: bytes, what: str, limit: int) -> str:
        """A stored JSON value that may be ``{"workhorse:sealed": ...}`` (a ``once()`` result)."""
        if not sealed_json.is_sealed(stored):
            return pretty_json(stored, limit)
        envelope = stored[sealed_json.SEALED_FIELD]
        return self._opened(
            envelope,
            lambda: pretty_json(
                json.loads(sealed_json.open_json(stored, associated_data=associated_data, what=what)), limit
            ),
        )

    def _opened(self, envelope: Any, show: Callable[[], str]) -> str:
        """``show()`` for a user who may view it; else, or if it does not open, ``envelope`` described."""
        if not self.allowed:
            return described(envelope)
        try:
            shown = show()
        except DecryptionError as exc:
            return f"{described(envelope)}: does not open ({exc.reason})"
        self.opened = True
        return shown


def encrypted_values(request: HttpRequest) -> EncryptedValues:
    """The request's ``EncryptedValues`` (one per request, so a page is logged once)."""
    found = getattr(request, _REQUEST_ATTRIBUTE, None)
    if found is None:
        found = EncryptedValues(allowed=may_view_encrypted(request))
        setattr(request, _REQUEST_ATTRIBUTE, found)
    return found


def log_if_viewed(
    model_admin: admin.ModelAdmin,  # type: ignore[type-arg]
    request: HttpRequest,
    response: HttpResponse,
) -> None:
    """Record in the admin log that the request's user viewed the encrypted values of the object
    whose page it is, if the page (answered with 200) showed any in clear."""
    values = getattr(request, _REQUEST_ATTRIBUTE, None)
    if values is not None and values.opened and values.shown is not None and response.status_code == 200:
        model_admin.log_change(request, values.shown, VIEWED)
