"""The operator's Django admin: jobs, dead letters, idempotency bindings, workers and a dashboard.

Everything is read-only by hand. Changing actions (cancel, run now, redrive, purge, release) each
need their own permission, are checked server-side, and record the acting user in the job's events
(purge, which deletes the job, in the admin log). Raw keys are never shown nor stored: the
"find a key" form hashes the key in memory and looks the hash up.

Every list checks its query string before any SQL runs (``CheckedChangeList``): a parameter PostgreSQL
cannot take (NUL, a non-integer or out-of-range number for an integer field) is an incorrect lookup,
which Django answers with the unfiltered list flagged ``?e=1``. Lists of jobs never load payloads,
results or whole errors.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import IGNORED_PARAMS, ChangeList
from django.contrib.postgres.expressions import ArraySubquery
from django.core.exceptions import FieldDoesNotExist, PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DataError, connections, router, transaction
from django.db.models import (
    BinaryField,
    BooleanField,
    Exists,
    ExpressionWrapper,
    F,
    ForeignKey,
    Func,
    IntegerField,
    Model,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.functions import Left
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator
from django.views.decorators.debug import sensitive_post_parameters

from django_workhorse import conf, stats
from django_workhorse.actions import cancel, purge, redrive, release_bindings, run_now
from django_workhorse.exceptions import WorkhorseError
from django_workhorse.fingerprint import key_hash
from django_workhorse.models import (
    TERMINAL_STATUSES,
    Checkpoint,
    DeadJob,
    IdempotencyBinding,
    Job,
    JobEvent,
    JobStatus,
    Redrive,
    WorkerRecord,
)
from django_workhorse.storable import check_text
from django_workhorse.types import KeyMode

# Payloads and results are shown pretty-printed up to this many characters, then cut.
JSON_DISPLAY_CHARS = 20_000
ERROR_SUMMARY_CHARS = 120
# Event details are shown cut to this many characters each.
EVENT_DETAIL_CHARS = 2000
RECENT_TAGS_SCAN = 1000
DASHBOARD_REFRESH_SECONDS = 10
HEX_DIGEST = re.compile(r"(?:[0-9a-f]{2}){1,32}")
INTEGER = re.compile(r"[+-]?[0-9]{1,20}")
# Lookups whose values are numbers of the field's type (``in`` takes a comma-separated list).
NUMERIC_LOOKUPS = frozenset({"", "exact", "in", "gt", "gte", "lt", "lte"})


def _actor(request: HttpRequest) -> str:
    """Who did it, as recorded in job events: ``admin:<username>``."""
    return f"admin:{request.user.get_username()}"


def _has(request: HttpRequest, permission: str) -> bool:
    return bool(request.user.is_active and request.user.is_staff and request.user.has_perm(f"workhorse.{permission}"))


def pretty_json(value: Any, limit: int = JSON_DISPLAY_CHARS) -> str:
    """Return ``value`` as indented JSON, cut after ``limit`` characters (templates escape it)."""
    try:
        text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)
    except RecursionError:  # indenting recurses in Python; compact encoding nests deeper
        text = json.dumps(value, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… ({len(text) - limit:,} more characters not shown)"


def _incorrect_lookup(*, field: str, bound: str, value: Any = None) -> IncorrectLookupParameters:
    return IncorrectLookupParameters(f"{field}: expected {bound}")


def parse_id(text: str) -> int | None:
    """The id ``text`` spells in ASCII digits, or None when it is no id (not digits, beyond bigint)."""
    if not INTEGER.fullmatch(text) or text[0] in "+-":
        return None
    number = int(text)
    return number if 1 <= number <= conf.MAX_ID else None


def check_query(query: QueryDict, model: type[Model]) -> None:
    """Refuse (``IncorrectLookupParameters``) a list's query string that PostgreSQL could not take.

    Every name and value must be storable text; a lookup on an integer field takes integers in the
    column's range. Anything else Django validates itself when it builds the query.
    """
    for name, values in query.lists():
        check_text(name, "a parameter name", error=_incorrect_lookup)
        for value in values:
            check_text(value, name, error=_incorrect_lookup)
        if name in IGNORED_PARAMS:
            continue
        if (bounds := _integer_bounds(model, name)) is not None:
            for value in values:
                _check_integers(value, name, bounds, many=name.endswith("__in"))


def _integer_bounds(model: type[Model], name: str) -> tuple[int, int] | None:
    """The range of the integer column a lookup compares with, or None if it is not such a lookup."""
    head, _, lookup = name.partition("__")
    if lookup not in NUMERIC_LOOKUPS:
        return None
    try:
        field: Any = model._meta.pk if head == "pk" else model._meta.get_field(head)
    except FieldDoesNotExist:
        return None
    if isinstance(field, ForeignKey):
        field = field.target_field
    if not isinstance(field, IntegerField):
        return None
    ops = connections[router.db_for_read(model)].ops
    low, high = ops.integer_field_range(field.get_internal_type())
    return int(low), int(high)


def _check_integers(value: str, name: str, bounds: tuple[int, int], *, many: bool) -> None:
    low, high = bounds
    for item in value.split(",") if many else [value]:
        if not INTEGER.fullmatch(item) or not low <= int(item) <= high:
            raise _incorrect_lookup(field=name, bound=f"integers in {low}..{high}")


class CheckedChangeList(ChangeList):
    """A changelist that checks its query string first and lets its admin trim what rows load."""

    def __init__(self, request: HttpRequest, model: type[Model], *args: Any, **kwargs: Any) -> None:
        check_query(request.GET, model)
        super().__init__(request, model, *args, **kwargs)

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        queryset = super().get_queryset(request, exclude_parameters)
        return cast("CheckedAdmin", self.model_admin).list_rows(queryset)

    def get_results(self, request: HttpRequest) -> None:
        # Django checks lookups when it builds the query; a few (a regex, say) PostgreSQL refuses only
        # when it runs, so the count and the page run here, where a refusal is an incorrect lookup.
        try:
            with transaction.atomic(using=self.queryset.db):
                super().get_results(request)
                len(self.result_list)
        except DataError as exc:
            raise IncorrectLookupParameters(exc) from exc


class CheckedAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Base of the app's admins: lists check their query string (``CheckedChangeList``)."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return CheckedChangeList

    def list_rows(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """What a list loads of each row (and of the rows its actions get); all fields by default."""
        return queryset


def digest_prefix_filter(term: str, *, of_jobs: bool = False) -> Q | None:
    """Match bindings (or, with ``of_jobs``, their jobs) whose key hash starts with the hex ``term``
    (a 12-hex digest, or longer); None when ``term`` is not hex."""
    term = term.strip().lower()
    if not HEX_DIGEST.fullmatch(term):
        return None
    prefix = Func(F("key_hash"), Value(1), Value(len(term) // 2), function="substring", output_field=BinaryField())
    matching = IdempotencyBinding.objects.annotate(prefix=prefix).filter(prefix=bytes.fromhex(term))
    return Q(pk__in=matching.values("job_id" if of_jobs else "pk"))


def live_binding_q(now: Any) -> Q:
    """Bindings that still own their key (the ORM twin of ``_FREE`` in sql/keys.py, negated)."""
    terminal = Q(job__status__in=TERMINAL_STATUSES)
    return (
        Q(mode__in=[KeyMode.IDEMPOTENCY, KeyMode.THROTTLE], expires_at__gt=now)
        | (Q(mode=KeyMode.UNIQUE) & ~terminal)
        | (Q(mode=KeyMode.DEBOUNCE) & (~terminal | Q(expires_at__gt=now)))
    )


# -- jobs ------------------------------------------------------------------------------------------


class HasKeyFilter(admin.SimpleListFilter):
    """Jobs that a keyed request created (they own, or owned, a binding)."""

    title = "key"
    parameter_name = "has_key"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "With a key"), ("no", "Without a key")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        keyed = Exists(IdempotencyBinding.objects.filter(job=OuterRef("pk")))
        if self.value() == "yes":
            return queryset.filter(keyed)
        if self.value() == "no":
            return queryset.filter(~keyed)
        return queryset


class TagFilter(admin.SimpleListFilter):
    """Jobs carrying a tag; offers the tags of the most recent jobs."""

    title = "tag"
    parameter_name = "tag"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = Job.objects.order_by("-id").values_list("tags", flat=True)[:RECENT_TAGS_SCAN]
        return [(tag, tag) for tag in sorted({tag for tags in recent for tag in tags or ()})]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(tags__contains=[self.value()]) if self.value() else queryset


class JobAdmin(CheckedAdmin):
    """Jobs: browse, filter, inspect; cancel, run now, redrive and purge with their permissions."""

    list_display = [
        "id",
        "job_type",
        "queue",
        "status",
        "priority",
        "attempts",
        "run_at",
        "created_at",
        "key",
    ]
    list_display_links = ["id", "job_type"]
    list_filter = ["status", ("queue", admin.AllValuesFieldListFilter), ("job_type", admin.AllValuesFieldListFilter)]
    list_filter += [HasKeyFilter, TagFilter]
    search_fields = ["job_type"]
    search_help_text = "A job id, a job type, or a key digest (12 hex characters)."
    ordering = ["-id"]
    list_per_page = 50
    show_full_result_count = False  # counting a large table on every page is slow
    exclude = ["payload", "result"]
    change_form_template = "admin/workhorse/job_detail.html"
    change_list_template = "admin/workhorse/job_change_list.html"
    actions = ["cancel_jobs", "run_jobs_now", "redrive_jobs", "purge_jobs"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        bindings = IdempotencyBinding.objects.filter(job=OuterRef("pk"))
        return (
            super()
            .get_queryset(request)
            .annotate(
                key_preview=Subquery(bindings.values("key_preview")[:1]),
                key_mode=Subquery(bindings.values("mode")[:1]),
            )
        )

    def list_rows(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Everything but the large values: payload and result stay unread, the error is read cut."""
        return queryset.defer("payload", "result", "last_error").annotate(
            error_head=Left("last_error", stats.ERROR_HEAD_CHARS)
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field.name for field in Job._meta.fields if field.name not in self.exclude]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # jobs are never edited by hand; actions change them

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # purge (queued jobs only) is the one way to delete

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return _has(request, "cancel_job")

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return _has(request, "redrive_job")

    def has_purge_permission(self, request: HttpRequest) -> bool:
        return _has(request, "purge_job")

    def has_run_now_permission(self, request: HttpRequest) -> bool:
        return _has(request, "run_job_now")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        matches = Q(job_type__icontains=term)
        if (job_id := parse_id(term)) is not None:
            matches |= Q(pk=job_id)
        if (by_digest := digest_prefix_filter(term, of_jobs=True)) is not None:
            matches |= by_digest
        return queryset.filter(matches), False

    @admin.display(description="attempts")
    def attempts(self, obj: Job) -> str:
        return f"{obj.attempt}/{obj.max_attempts}"

    @admin.display(description="key")
    def key(self, obj: Any) -> str:
        return f"{obj.key_mode}: {obj.key_preview}" if obj.key_preview else ""

    # -- actions ------------------------------------------------------------------------------

    @admin.action(description="Cancel selected jobs", permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        before: Counter[str] = Counter()
        for job_id in queryset.values_list("pk", flat=True):
            before[cancel(job_id, requested_by=_actor(request))] += 1
        cancelled, asked = before[JobStatus.QUEUED], before[JobStatus.RUNNING]
        finished = sum(before.values()) - cancelled - asked
        self.message_user(
            request,
            f"Cancelled {cancelled} queued job(s); asked {asked} running job(s) to stop; "
            f"{finished} had already finished.",
            messages.SUCCESS,
        )

    @admin.action(description="Run selected scheduled jobs now", permissions=["run_now"])
    def run_jobs_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        moved = run_now(ids, requested_by=_actor(request))
        self.message_user(
            request, f"{len(moved)} job(s) are due now; {len(ids) - len(moved)} were not queued for later."
        )

    @admin.action(description="Redrive selected dead jobs…", permissions=["redrive"])
    def redrive_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        dead = list(queryset.filter(status=JobStatus.DEAD).order_by("id"))
        skipped = queryset.exclude(status=JobStatus.DEAD).count()
        request_id = _confirmed_request_id(request)
        if request_id is None:
            return _confirm(
                self,
                request,
                action="redrive_jobs",
                title="Redrive dead jobs",
                verb="Redrive",
                jobs=dead,
                skipped=skipped,
                explanation="Each dead job runs again as a new job; the dead job stays as it is. "
                "Submitting this page twice redrives each job once.",
            )
        created = []
        for job in dead:
            try:
                created.append(
                    (job.pk, redrive(job.pk, request_id=f"admin:{request_id}", requested_by=_actor(request)))
                )
            except WorkhorseError as exc:
                self.message_user(request, f"Job {job.pk}: {exc}", messages.ERROR)
        summary = ", ".join(f"{old} → {new}" for old, new in created)
        self.message_user(request, f"Redrove {len(created)} job(s): {summary or 'none'}.", messages.SUCCESS)
        return None

    @admin.action(description="Purge selected queued jobs…", permissions=["purge"])
    def purge_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        queued = list(queryset.filter(status=JobStatus.QUEUED).order_by("id"))
        skipped = queryset.exclude(status=JobStatus.QUEUED).count()
        if _confirmed_request_id(request) is None:
            return _confirm(
                self,
                request,
                action="purge_jobs",
                title="Purge queued jobs",
                verb="Purge",
                jobs=queued,
                skipped=skipped,
                explanation="Purged jobs are deleted with their history, and their keys are released at once. "
                "Running and finished jobs are never purged.",
            )
        count = purge(job_ids=[job.pk for job in queued]) if queued else 0
        remaining = set(Job.objects.filter(pk__in=[job.pk for job in queued]).values_list("pk", flat=True))
        gone = [job for job in queued if job.pk not in remaining]
        if gone:
            self.log_deletions(request, gone)  # type: ignore[arg-type]  # the jobs' events went with them: the admin log keeps who
        self.message_user(request, f"Purged {count} queued job(s).", messages.SUCCESS)
        return None

    # -- detail page and dashboard -----------------------------------------------------------

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        job = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if job is not None:
            binding = IdempotencyBinding.objects.filter(job=job).first()
            context.update(
                payload_json=pretty_json(job.payload),
                result_json=None if job.result is None else pretty_json(job.result),
                events=[
                    (event, event_details(event.details)) for event in JobEvent.objects.filter(job=job).order_by("id")
                ],
                checkpoints=[(c, pretty_json(c.value, 2000)) for c in Checkpoint.objects.filter(job=job)],
                redriven_from=Redrive.objects.filter(new_job=job).first(),
                redriven_to=list(Redrive.objects.filter(source=job).order_by("id")),
                binding=binding,
                binding_live=binding is not None
                and IdempotencyBinding.objects.filter(live_binding_q(timezone.now()), pk=binding.pk).exists(),
            )
        return super().change_view(request, object_id, form_url, context)

    def get_urls(self) -> list[URLPattern]:
        dashboard = path("dashboard/", self.admin_site.admin_view(self.dashboard_view), name="workhorse_dashboard")
        return [dashboard, *super().get_urls()]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """Queue depths, throughput over the last hour, recent failures and workers; refreshes itself."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        now = timezone.now()
        throughput = stats.throughput(now=now)
        context = {
            **self.admin_site.each_context(request),
            "title": "Workhorse dashboard",
            "opts": self.model._meta,
            "now": now,
            "depths": stats.queue_depths(now=now),
            "throughput": throughput,
            "chart": throughput_chart(throughput),
            "failures": [(job, error_summary(error_head(job))) for job in stats.recent_failures()],
            "workers": stats.workers(),
            "refresh_seconds": DASHBOARD_REFRESH_SECONDS,
        }
        return TemplateResponse(request, "admin/workhorse/dashboard.html", context)


def error_summary(error: str) -> str:
    """The first line of an error, cut to a table cell."""
    first = next((line for line in error.splitlines() if line.strip()), "")
    return Truncator(first).chars(ERROR_SUMMARY_CHARS)


def error_head(job: Job) -> str:
    """The start of a job's error as a list loaded it (``error_head``), else the whole error."""
    head = getattr(job, "error_head", None)
    return job.last_error if head is None else str(head)


def event_details(details: Any) -> list[tuple[str, str]]:
    """An event's details as (name, value) text, each value cut; any stored JSON is shown."""
    if not isinstance(details, dict):
        return [("", Truncator(pretty_json(details, EVENT_DETAIL_CHARS)).chars(EVENT_DETAIL_CHARS))]
    return [
        (Truncator(str(name)).chars(EVENT_DETAIL_CHARS), Truncator(str(value)).chars(EVENT_DETAIL_CHARS))
        for name, value in details.items()
    ]


def throughput_chart(throughput: stats.Throughput, *, width: int = 720, height: int = 140) -> dict[str, Any]:
    """Lay out the per-minute bars of an SVG chart (succeeded stacked under failed)."""
    peak = max((s + f for s, f in zip(throughput.succeeded, throughput.failed, strict=True)), default=0) or 1
    step = width / max(len(throughput.minutes), 1)
    bars = []
    for i, (minute, ok, failed) in enumerate(
        zip(throughput.minutes, throughput.succeeded, throughput.failed, strict=True)
    ):
        ok_height = height * ok / peak
        failed_height = height * failed / peak
        bars.append(
            {
                "x": round(i * step, 1),
                "width": round(max(step - 1, 1), 1),
                "ok_y": round(height - ok_height, 1),
                "ok_height": round(ok_height, 1),
                "failed_y": round(height - ok_height - failed_height, 1),
                "failed_height": round(failed_height, 1),
                "label": f"{minute:%H:%M} — {ok} succeeded, {failed} failed",
            }
        )
    return {"width": width, "height": height, "peak": peak, "bars": bars}


def _confirmed_request_id(request: HttpRequest) -> str | None:
    """The request id of a submitted confirmation page, or None before confirmation."""
    if request.POST.get("confirmed") != "yes":
        return None
    try:
        return uuid.UUID(request.POST.get("request_id", "")).hex
    except ValueError:
        raise PermissionDenied("the confirmation carries no valid request id") from None


def _confirm(
    model_admin: admin.ModelAdmin,  # type: ignore[type-arg]
    request: HttpRequest,
    *,
    action: str,
    title: str,
    verb: str,
    jobs: Sequence[Job],
    skipped: int,
    explanation: str,
) -> HttpResponse:
    """Show the preview of an action; submitting it runs the action with a fresh request id."""
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": model_admin.model._meta,
        "action": action,
        "verb": verb,
        "jobs": [(job, error_summary(error_head(job))) for job in jobs],
        "skipped": skipped,
        "explanation": explanation,
        "request_id": uuid.uuid4().hex,
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "select_across": request.POST.get("select_across", "0"),
    }
    return TemplateResponse(request, "admin/workhorse/confirm_action.html", context)


class DeadJobAdmin(JobAdmin):
    """Dead letters: jobs whose last attempt failed, with their error; redrive in bulk."""

    list_display = ["id", "job_type", "queue", "attempts", "finished_at", "error", "key"]
    list_filter = [("queue", admin.AllValuesFieldListFilter), ("job_type", admin.AllValuesFieldListFilter), TagFilter]
    change_list_template = "admin/change_list.html"
    actions = ["redrive_jobs"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).filter(status=JobStatus.DEAD)

    def get_urls(self) -> list[URLPattern]:
        return admin.ModelAdmin.get_urls(self)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _has(request, "view_job") or super().has_view_permission(request, obj)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return _has(request, "view_job") or super().has_module_permission(request)

    @admin.display(description="error")
    def error(self, obj: Job) -> str:
        return error_summary(error_head(obj))


# -- bindings ----------------------------------------------------------------------------------------


class LiveFilter(admin.SimpleListFilter):
    """Bindings that still own their key, or that own nothing any more (expired, job finished)."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("active", "Active"), ("expired", "Expired / free")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        live = live_binding_q(timezone.now())
        if self.value() == "active":
            return queryset.filter(live)
        if self.value() == "expired":
            return queryset.exclude(live)
        return queryset


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
    "created_at",
    "expires_at",
    "active",
    "request_digest_hex",
    "previous_request_digest_hex",
    "field_digests",
)


class BindingAdmin(CheckedAdmin):
    """Idempotency bindings: who owns which key (by preview and digest), until when; release."""

    list_display = ["key_preview", "key_digest", "scope", "mode", "job_link", "created_at", "expires_at", "active"]
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
        live = ExpressionWrapper(live_binding_q(timezone.now()), output_field=BooleanField())
        return super().get_queryset(request).select_related("job").annotate(is_live=live)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # "release" is the way to delete, with its own permission

    def has_release_permission(self, request: HttpRequest) -> bool:
        return _has(request, "release_binding")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        matches = Q(scope__icontains=term)
        if (by_digest := digest_prefix_filter(term)) is not None:
            matches |= by_digest
        return queryset.filter(matches), False

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
        if _confirmed_request_id(request) is None:
            context = {
                **self.admin_site.each_context(request),
                "title": "Release keys",
                "opts": self.model._meta,
                "bindings": bindings,
                "request_id": uuid.uuid4().hex,
                "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
                "select_across": request.POST.get("select_across", "0"),
            }
            return TemplateResponse(request, "admin/workhorse/confirm_release.html", context)
        released = release_bindings([b.pk for b in bindings], requested_by=_actor(request))
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


# -- workers ---------------------------------------------------------------------------------------


class WorkerAdmin(CheckedAdmin):
    """Registered worker processes, their last heartbeat and the jobs they hold."""

    list_display = ["name", "host", "pid", "queue_list", "concurrency", "heartbeat_at", "heartbeat_age", "jobs"]
    readonly_fields = ["name", "host", "pid", "queues", "concurrency", "started_at", "heartbeat_at", "jobs"]
    ordering = ["name"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        running = Job.objects.filter(status=JobStatus.RUNNING, claimed_by=OuterRef("name")).order_by("id")
        return super().get_queryset(request).annotate(running_job_ids=ArraySubquery(running.values("id")))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="queues")
    def queue_list(self, obj: WorkerRecord) -> str:
        return ", ".join(obj.queues)

    @admin.display(description="heartbeat age")
    def heartbeat_age(self, obj: WorkerRecord) -> str:
        seconds = max((timezone.now() - obj.heartbeat_at).total_seconds(), 0.0)
        return f"{seconds:.0f} s"

    @admin.display(description="current jobs")
    def jobs(self, obj: Any) -> str:
        links: Callable[[int], tuple[str, int]] = lambda pk: (reverse("admin:workhorse_job_change", args=[pk]), pk)  # noqa: E731
        return format_html_join(", ", '<a href="{}">#{}</a>', (links(pk) for pk in obj.running_job_ids))


admin.site.register(Job, JobAdmin)
admin.site.register(DeadJob, DeadJobAdmin)
admin.site.register(IdempotencyBinding, BindingAdmin)
admin.site.register(WorkerRecord, WorkerAdmin)
