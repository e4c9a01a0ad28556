"""Idempotency bindings: which job owns which key, until when; release; find the binding of a raw key.

Raw keys are never shown nor stored: the "find a key" form hashes the key in memory and looks the
hash up.
"""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import BinaryField, BooleanField, ExpressionWrapper, F, Func, Q, QuerySet, Value
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.views.decorators.debug import sensitive_post_parameters

from django_workhorse import conf
from django_workhorse.enqueueing.fingerprints import key_hash
from django_workhorse.enqueueing.storable import check_text
from django_workhorse.models import HashedKey, IdempotencyBinding
from django_workhorse.operations.actions import release_bindings
from django_workhorse.querysets import free_binding_q

from .base import ReadOnlyAdmin, YesNoFilter, actor, has_permission
from .confirmation import Preview, confirm, confirmed_request_id
from .display import cut, instant_cell, instant_field, job_anchor, stacked

HEX_DIGEST = re.compile(r"(?:[0-9a-f]{2}){1,32}")


def digest_prefix_filter(term: str, *, of_jobs: bool = False, model: type[HashedKey] = IdempotencyBinding) -> Q | None:
    """Match rows of ``model`` (bindings, or ledger entries) whose key hash starts with the hex ``term``
    (a 12-hex digest, or longer), or with ``of_jobs`` the bindings' jobs; None when ``term`` is not hex."""
    term = term.strip().lower()
    if not HEX_DIGEST.fullmatch(term):
        return None
    prefix = Func(F("key_hash"), Value(1), Value(len(term) // 2), function="substring", output_field=BinaryField())
    matching = model._default_manager.annotate(prefix=prefix).filter(prefix=bytes.fromhex(term))
    return Q(pk__in=matching.values("job_id" if of_jobs else "pk"))


class LiveFilter(YesNoFilter):
    """Bindings that still own their key, or that own nothing any more (expired, job finished)."""

    title = "state"
    parameter_name = "state"
    two_choices = (("active", "Active"), ("expired", "Expired / free"))

    def condition(self) -> Any:
        return ~free_binding_q(timezone.now())


class FindKeyForm(forms.Form):
    """Scope and raw key; the key is hashed in memory and never stored, logged or echoed."""

    scope = forms.CharField(max_length=conf.MAX_SCOPE_BYTES, initial="default")
    key = forms.CharField(max_length=conf.MAX_KEY_BYTES, strip=False, widget=forms.PasswordInput(render_value=False))

    def clean_scope(self) -> str:
        return check_text(self.cleaned_data["scope"], "scope", max_bytes=conf.MAX_SCOPE_BYTES, error=_form_error)

    def clean_key(self) -> str:
        return check_text(self.cleaned_data["key"], "key", max_bytes=conf.MAX_KEY_BYTES, secret=True, error=_form_error)


def _form_error(*, field: str, bound: str, value: Any = None) -> forms.ValidationError:
    return forms.ValidationError(f"Expected {bound}.")  # never the value: it may be a key


BINDING_FIELDS = (
    "scope",
    "mode",
    "key_preview",
    "key_digest",
    "key_hash_hex",
    "job_link",
    "created",
    "expires_utc",
    "active",
    "request_digest_hex",
    "previous_request_digest_hex",
    "field_digests",
)

RELEASE = Preview(
    action="release",
    title="Release keys",
    verb="Release",
    explanation="Releasing a key frees it at once: the next request with it creates a new job. "
    "The jobs stay as they are.",
    noun="key",
    columns=("key", "digest", "scope", "mode", "job"),  # one row a binding (``_release_row``)
)


def _release_row(binding: IdempotencyBinding) -> tuple[object, ...]:
    job = format_html("{} ({})", job_anchor(binding.job_id), binding.job.status)
    return (binding.key_preview, binding.key_digest, binding.scope, binding.mode, job)


class BindingAdmin(ReadOnlyAdmin):
    """Idempotency bindings: who owns which key (by preview and digest), until when; release."""

    list_display = ["key", "scope_and_mode", "job_cell", "expires", "active"]
    list_filter = ["mode", LiveFilter, ("scope", admin.AllValuesFieldListFilter)]
    search_fields = ["scope"]
    search_help_text = "A key digest (12 hex characters) or a scope."
    ordering = ["-id"]
    list_per_page = 50
    show_full_result_count = False
    fields = BINDING_FIELDS
    readonly_fields = BINDING_FIELDS
    change_list_template = "admin/workhorse/binding_change_list.html"
    actions = ["release"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        live = ExpressionWrapper(~free_binding_q(timezone.now()), output_field=BooleanField())
        return super().get_queryset(request).select_related("job").annotate(is_live=live)

    def has_release_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "release_binding")

    def search_matches(self, term: str) -> Q:
        """A scope containing ``term``, or a key digest prefix."""
        matches = Q(scope__icontains=term)
        if (by_digest := digest_prefix_filter(term)) is not None:
            matches |= by_digest
        return matches

    created = instant_field("created_at", "created at")
    expires_utc = instant_field("expires_at", "expires at")

    @admin.display(description="key (digest)")
    def key(self, obj: IdempotencyBinding) -> SafeString:
        return stacked(cut(obj.key_preview), obj.key_digest)

    @admin.display(description="scope (mode)", ordering="scope")
    def scope_and_mode(self, obj: IdempotencyBinding) -> SafeString:
        return stacked(cut(obj.scope, width="wide"), obj.mode)

    @admin.display(description="job")
    def job_cell(self, obj: IdempotencyBinding) -> SafeString:
        return stacked(
            format_html("{} {}", job_anchor(obj.job_id), obj.job.status), cut(obj.job.job_type, width="wide")
        )

    @admin.display(description="expires at", ordering="expires_at")
    def expires(self, obj: IdempotencyBinding) -> SafeString | str:
        return instant_cell(obj.expires_at)

    @admin.display(description="key digest")
    def key_digest(self, obj: IdempotencyBinding) -> str:
        return obj.key_digest

    @admin.display(description="key hash")
    def key_hash_hex(self, obj: IdempotencyBinding) -> str:
        return bytes(obj.key_hash).hex()

    @admin.display(description="request digest")
    def request_digest_hex(self, obj: IdempotencyBinding) -> str:
        return bytes(obj.request_digest).hex()

    @admin.display(description="replaced request digest")
    def previous_request_digest_hex(self, obj: IdempotencyBinding) -> str:
        return bytes(obj.previous_request_digest).hex() if obj.previous_request_digest else "—"

    @admin.display(description="job")
    def job_link(self, obj: IdempotencyBinding) -> str:
        url = reverse("admin:workhorse_job_change", args=[obj.job_id])
        return format_html('<a href="{}">#{} {} ({})</a>', url, obj.job_id, obj.job.job_type, obj.job.status)

    @admin.display(description="active", boolean=True)
    def active(self, obj: Any) -> bool:
        return bool(getattr(obj, "is_live", False))

    @admin.action(description="Release selected keys…", permissions=["release"])
    def release(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        bindings = list(queryset.order_by("id"))
        if confirmed_request_id(request) is None:
            return confirm(self, request, RELEASE, rows=[_release_row(binding) for binding in bindings])
        released = release_bindings([b.pk for b in bindings], requested_by=actor(request))
        self.message_user(
            request,
            f"Released {len(released)} key(s); the next request with one of them creates a new job.",
            messages.SUCCESS,
        )
        return None

    def get_urls(self) -> list[URLPattern]:
        find = path("find/", self.admin_site.admin_view(self.find_view), name="workhorse_binding_find")
        return [find, *super().get_urls()]

    @method_decorator(sensitive_post_parameters("key"))  # kept out of error reports too
    def find_view(self, request: HttpRequest) -> HttpResponse:
        """Look a raw key up by its hash; the key is neither stored nor shown again."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = FindKeyForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            hashed = key_hash(form.cleaned_data["scope"], form.cleaned_data["key"])
            found = IdempotencyBinding.objects.filter(scope=form.cleaned_data["scope"], key_hash=hashed).first()
            if found is not None:
                return HttpResponseRedirect(reverse("admin:workhorse_idempotencybinding_change", args=[found.pk]))
            self.message_user(
                request, f"No binding holds that key in scope {form.cleaned_data['scope']!r}.", messages.WARNING
            )
            form = FindKeyForm(initial={"scope": form.cleaned_data["scope"]})
        context = {
            **self.admin_site.each_context(request),
            "title": "Find the binding of a key",
            "opts": self.model._meta,
            "form": form,
        }
        return TemplateResponse(request, "admin/workhorse/find_binding.html", context)
