"""The effect ledger: ``once()`` effects and ``@idempotent`` views' records, read-only; release.

Raw keys are never shown nor stored: an entry shows its scope, owner, key preview and digest, and
for an HTTP record the stored status and the body's size (never the body); releasing an entry lets
its key run again. A sealed ``once()`` result is described or opened as ``encrypted`` says.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib import admin, messages
from django.db.models import BooleanField, ExpressionWrapper, F, Func, IntegerField, Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.utils.safestring import SafeString

from django_workhorse.effects.ledger import result_associated_data
from django_workhorse.encryption import sealed_json
from django_workhorse.enqueueing.fingerprints import key_digest
from django_workhorse.models import EffectRecord
from django_workhorse.operations.actions import release_effects

from .base import ReadOnlyAdmin, YesNoFilter, has_permission
from .bindings import digest_prefix_filter
from .confirmation import Preview, confirm, confirmed_request_id
from .display import JSON_DISPLAY_CHARS, cut, instant_cell, instant_field, pretty_json, stacked
from .encrypted import encrypted_values, log_if_viewed

LEDGER_FIELDS = (
    "kind",
    "scope",
    "owner",
    "key_preview",
    "key_digest",
    "status_code",
    "created",
    "completed",
    "expires_utc",
    "live",
    "request_digest_hex",
    "field_digests",
    "stored_result",
    "response_size",
)

RELEASE = Preview(
    action="release",
    title="Release ledger entries",
    verb="Release",
    explanation="Releasing an entry frees its key at once: the next once() with it runs the effect again, "
    "the next request with it runs the view again. What the effect or the view did stays done.",
    noun="ledger record",
    columns=("kind", "key", "digest", "scope", "owner"),
)


class LiveFilter(YesNoFilter):
    """Entries within their retention window, or past it (a repeat runs again; maintenance prunes them)."""

    title = "state"
    parameter_name = "state"
    two_choices = (("live", "Live"), ("expired", "Expired"))

    def condition(self) -> Any:
        return Q(expires_at__gt=Now())


class LedgerAdmin(ReadOnlyAdmin):
    """Ledger entries by scope, owner, preview and digest; an HTTP record's status; release."""

    list_display = ["key", "kind_and_status", "scope_and_owner", "expires", "live"]
    list_filter = ["kind", LiveFilter, ("scope", admin.AllValuesFieldListFilter)]
    search_fields = ["scope", "owner"]
    search_help_text = "A key digest (12 hex characters), a scope or an owner."
    ordering = ["-id"]
    list_per_page = 50
    show_full_result_count = False
    fields = LEDGER_FIELDS
    readonly_fields = LEDGER_FIELDS
    actions = ["release"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        live = ExpressionWrapper(Q(expires_at__gt=Now()), output_field=BooleanField())
        # The body's size, not the body: a stored response can be a megabyte, and is never shown.
        size = Func(F("response_body"), function="octet_length", output_field=IntegerField())
        return super().get_queryset(request).defer("response_body").annotate(is_live=live, body_size=size)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        entry = super().get_object(request, object_id, from_field)
        if entry is not None and entry.kind == "effect" and sealed_json.is_sealed(entry.result):
            hashed = bytes(entry.key_hash)
            what = f"the once() result {entry.key_preview} [{key_digest(hashed)}] in scope {entry.scope!r}"
            values = encrypted_values(request)
            values.shown = entry
            entry.shown_result = values.effect_json(
                entry.result,
                associated_data=result_associated_data(entry.scope, hashed),
                what=what,
                limit=JSON_DISPLAY_CHARS,
            )
        return entry

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        response = super().change_view(request, object_id, form_url, extra_context)
        log_if_viewed(self, request, response)
        return response

    def has_release_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "release_effect")

    def search_matches(self, term: str) -> Q:
        """A scope or owner containing ``term``, or a key digest prefix."""
        matches = Q(scope__icontains=term) | Q(owner__icontains=term)
        if (by_digest := digest_prefix_filter(term, model=EffectRecord)) is not None:
            matches |= by_digest
        return matches

    created = instant_field("created_at", "created at")
    completed = instant_field("completed_at", "completed at")
    expires_utc = instant_field("expires_at", "expires at")

    @admin.display(description="key (digest)")
    def key(self, obj: EffectRecord) -> SafeString:
        return stacked(cut(obj.key_preview), obj.key_digest)

    @admin.display(description="kind", ordering="kind")
    def kind_and_status(self, obj: EffectRecord) -> str:
        return f"HTTP {obj.status_code or '—'}" if obj.kind == "http" else "once() effect"

    @admin.display(description="scope (owner)", ordering="scope")
    def scope_and_owner(self, obj: EffectRecord) -> SafeString:
        return stacked(cut(obj.scope, width="wide"), cut(obj.owner, width="wide") if obj.owner else "—")

    @admin.display(description="expires at", ordering="expires_at")
    def expires(self, obj: EffectRecord) -> SafeString | str:
        return instant_cell(obj.expires_at)

    @admin.display(description="key digest")
    def key_digest(self, obj: EffectRecord) -> str:
        return obj.key_digest

    @admin.display(description="request digest")
    def request_digest_hex(self, obj: EffectRecord) -> str:
        return bytes(obj.request_digest).hex() if obj.request_digest else "—"

    @admin.display(description="result")
    def stored_result(self, obj: EffectRecord) -> str:
        if obj.kind != "effect":
            return "—"
        return getattr(obj, "shown_result", None) or pretty_json(obj.result)  # ``get_object`` shows a sealed one

    @admin.display(description="response body")
    def response_size(self, obj: Any) -> str:
        size = getattr(obj, "body_size", None)
        if size is None:
            return "—"
        return (
            f"{size} bytes, encrypted (not shown)"
            if sealed_json.is_sealed(obj.response_headers)
            else f"{size} bytes (not shown)"
        )

    @admin.display(description="live", boolean=True)
    def live(self, obj: Any) -> bool:
        return bool(getattr(obj, "is_live", False))

    @admin.action(description="Release selected entries…", permissions=["release"])
    def release(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        entries = list(queryset.order_by("id"))
        if confirmed_request_id(request) is None:
            rows = [(e.kind, e.key_preview, e.key_digest, e.scope, e.owner or "—") for e in entries]
            return confirm(self, request, RELEASE, rows=rows)
        released = release_effects([entry.pk for entry in entries])
        gone = [entry for entry in entries if entry.pk in set(released)]
        self.log_deletions(request, cast(Any, gone))  # deleted already: the rows as they were
        self.message_user(
            request,
            f"Released {len(released)} entr{'y' if len(released) == 1 else 'ies'}; their keys run again.",
            messages.SUCCESS,
        )
        return None
