"""Jobs: browse, filter and inspect them; cancel, run now, redrive and purge, each with its permission.

Lists of jobs never load payloads, results or whole errors. Purge, which deletes the job and its
events, records the acting user in the admin log; the other actions record it in the job's events.

The list shows a *failing* job (queued, waiting for a retry: ``states.failing_q``) as a state of
its own and filters on it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.contrib import admin, messages
from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils.html import format_html
from django.utils.safestring import SafeString

from django_workhorse.encryption.jobs import CHECKPOINT_PREFIX, LAST_ERROR, PAYLOAD, RESULT
from django_workhorse.exceptions import WorkhorseError
from django_workhorse.models import (
    Checkpoint,
    EventKind,
    IdempotencyBinding,
    Job,
    JobEvent,
    JobStatus,
    QueueState,
    Redrive,
)
from django_workhorse.operations import stats
from django_workhorse.operations.actions import cancel, purge, purgeable, redrive, run_now

from .base import ReadOnlyAdmin, YesNoFilter, actor, has_permission, parse_id
from .bindings import digest_prefix_filter
from .breakers import held_line, rate_held_line
from .confirmation import Preview, confirm, confirmed_request_id, job_rows
from .dashboard import dashboard_view
from .display import (
    CHECKPOINT_DISPLAY_CHARS,
    JSON_DISPLAY_CHARS,
    cut,
    error_head,
    error_line,
    instant_cell,
    instant_field,
    retry_policy_words,
    stacked,
)
from .encrypted import encrypted_values, log_if_viewed
from .states import FAILING, failing_q, is_failing

RECENT_TAGS_SCAN = 1000

# A job's page leads with what an operator reads first; the rest is folded away below the timeline.
LEAD_FIELDS = ("job_type", "queue", "status_line", "attempts", "run_at_utc", "finished_at_utc", "error_text")
FOLDED_FIELDSETS = (
    (
        "Options",
        ("priority", "retry", "tags", "timeout", "deadline_utc", "concurrency_key", "concurrency_limit", "breaker_key"),
    ),
    (
        "Internals",
        (
            "created_at_utc",
            "started_at_utc",
            "scheduled_for_utc",
            "claimed_by",
            "lease_token",
            "lease_expires_at_utc",
            "concurrency_slot",
            "cancel_requested",
            "root_id",
            "trace_context",
        ),
    ),
)

# The preview pages of the two actions that ask for confirmation.
REDRIVE = Preview(
    action="redrive_jobs",
    title="Redrive dead jobs",
    verb="Redrive",
    explanation="Each dead job runs again as a new job; the dead job stays as it is. "
    "Submitting this page twice redrives each job once.",
)
PURGE = Preview(
    action="purge_jobs",
    title="Purge queued jobs",
    verb="Purge",
    explanation="Purged jobs are deleted with their history, and their keys are released at once. "
    "Running and finished jobs are never purged.",
)


class StatusFilter(admin.SimpleListFilter):
    """A job's status, with *failing* (queued, waiting for a retry) next to queued."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        choices: list[tuple[str, str]] = []
        for value, label in JobStatus.choices:
            choices.append((str(value), str(label)))
            if value == JobStatus.QUEUED:
                choices.append((FAILING, "Failing (waiting for a retry)"))
        return choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == FAILING:
            return queryset.filter(failing_q())
        if self.value() is None:
            return queryset
        return queryset.filter(status=self.value())  # not a status: nothing, as Django's own filter


class HasKeyFilter(YesNoFilter):
    """Jobs that a keyed request created (they own, or owned, a binding)."""

    title = "key"
    parameter_name = "has_key"
    two_choices = (("yes", "With a key"), ("no", "Without a key"))

    def condition(self) -> Any:
        return Exists(IdempotencyBinding.objects.filter(job=OuterRef("pk")))


class TagFilter(admin.SimpleListFilter):
    """Jobs carrying a tag; offers the tags of the most recent jobs."""

    title = "tag"
    parameter_name = "tag"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = Job.objects.order_by("-id").values_list("tags", flat=True)[:RECENT_TAGS_SCAN]
        return [(tag, tag) for tag in sorted({tag for tags in recent for tag in tags or ()})]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(tags__contains=[self.value()]) if self.value() else queryset


class JobAdmin(ReadOnlyAdmin):
    """Jobs: browse, filter, inspect; cancel, run now, redrive and purge with their permissions."""

    list_display = ["id", "job", "state", "runs_at", "last_error_line"]
    list_display_links = ["id", "job"]
    list_filter = [
        StatusFilter,
        ("queue", admin.AllValuesFieldListFilter),
        ("job_type", admin.AllValuesFieldListFilter),
    ]
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
        return queryset.defer("payload", "result", "last_error").annotate(**stats.error_fields())

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        folded = [(name, {"fields": fields, "classes": ["collapse"]}) for name, fields in FOLDED_FIELDSETS]
        return [(None, {"fields": LEAD_FIELDS}), *folded]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field for _, options in self.get_fieldsets(request, obj) for field in options["fields"]]

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "cancel_job")

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "redrive_job")

    def has_purge_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "purge_job")

    def has_run_now_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "run_job_now")

    def search_matches(self, term: str) -> Q:
        """A job type containing ``term``, the job ``term`` spells the id of, or a key digest prefix."""
        matches = Q(job_type__icontains=term)
        if (job_id := parse_id(term)) is not None:
            matches |= Q(pk=job_id)
        if (by_digest := digest_prefix_filter(term, of_jobs=True)) is not None:
            matches |= by_digest
        return matches

    @admin.display(description="job (queue, key)", ordering="job_type")
    def job(self, obj: Any) -> SafeString:
        job = stacked(cut(obj.job_type, width="wide"), cut(obj.queue, width="wide"))
        return stacked(job, self.key(obj)) if obj.key_preview else job

    @admin.display(description="state (attempts)", ordering="status")
    def state(self, obj: Job) -> SafeString:
        return stacked(FAILING if is_failing(obj) else obj.status, self.attempts(obj))

    @admin.display(description="attempts")
    def attempts(self, obj: Job) -> str:
        snoozed = f", snoozed {obj.snoozes}×" if obj.snoozes else ""
        return f"{obj.attempt}/{obj.max_attempts}{snoozed}"

    @admin.display(description="runs at", ordering="run_at")
    def runs_at(self, obj: Job) -> SafeString | str:
        return instant_cell(obj.run_at)

    @admin.display(description="last error")
    def last_error_line(self, obj: Job) -> SafeString | str:
        return error_line(error_head(obj))

    @admin.display(description="key")
    def key(self, obj: Any) -> SafeString | str:
        return cut(f"{obj.key_mode}: {obj.key_preview}", width="wide") if obj.key_preview else ""

    # -- a job's page -------------------------------------------------------------------------

    @admin.display(description="status")
    def status_line(self, obj: Job) -> str:
        if obj.status == JobStatus.QUEUED and obj.held_since is not None and obj.breaker_key is not None:
            return f"{obj.status}, {held_line(obj)}"
        if obj.status == JobStatus.QUEUED and obj.held_since is not None and obj.rate_limit is not None:
            return f"{obj.status}, {rate_held_line(obj)}"
        return f"{FAILING} (queued, waiting for a retry)" if is_failing(obj) else obj.status

    @admin.display(description="last error")
    def error_text(self, obj: Job) -> SafeString | str:
        error = getattr(obj, "shown_error", obj.last_error)  # as ``get_object`` shows it to the request's user
        return format_html('<pre class="workhorse-traceback">{}</pre>', error) if error else "—"

    @admin.display(description="retry policy")
    def retry(self, obj: Job) -> str:
        return retry_policy_words(obj.retry_policy)

    run_at_utc = instant_field("run_at", "runs at")
    finished_at_utc = instant_field("finished_at", "finished at")
    created_at_utc = instant_field("created_at", "created at")
    started_at_utc = instant_field("started_at", "started at")
    scheduled_for_utc = instant_field("scheduled_for", "scheduled for")
    deadline_utc = instant_field("deadline", "deadline")
    lease_expires_at_utc = instant_field("lease_expires_at", "lease expires at")

    # -- actions ------------------------------------------------------------------------------

    @admin.action(description="Cancel selected jobs", permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        before: Counter[str] = Counter()
        for job_id in queryset.values_list("pk", flat=True):
            before[cancel(job_id, requested_by=actor(request))] += 1
        cancelled, asked = before[JobStatus.QUEUED], before[JobStatus.RUNNING]
        waiting = before[JobStatus.WAITING]
        finished = sum(before.values()) - cancelled - asked - waiting
        steps = f"cancelled {waiting} waiting workflow step(s) and the steps after them; " if waiting else ""
        self.message_user(
            request,
            f"Cancelled {cancelled} queued job(s); {steps}asked {asked} running job(s) to stop; "
            f"{finished} had already finished.",
            messages.SUCCESS,
        )

    @admin.action(description="Run selected scheduled jobs now", permissions=["run_now"])
    def run_jobs_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        moved = run_now(ids, requested_by=actor(request))
        self.message_user(
            request, f"{len(moved)} job(s) are due now; {len(ids) - len(moved)} were not queued for later."
        )

    @admin.action(description="Redrive selected dead jobs…", permissions=["redrive"])
    def redrive_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        dead = list(queryset.filter(status=JobStatus.DEAD).order_by("id"))
        skipped = queryset.exclude(status=JobStatus.DEAD).count()
        request_id = confirmed_request_id(request)
        if request_id is None:
            return confirm(self, request, REDRIVE, rows=job_rows(dead), skipped=skipped)
        created = []
        for job in dead:
            try:
                created.append((job.pk, redrive(job.pk, request_id=f"admin:{request_id}", requested_by=actor(request))))
            except WorkhorseError as exc:
                self.message_user(request, f"Job {job.pk}: {exc}", messages.ERROR)
        summary = ", ".join(f"{old} → {new}" for old, new in created)
        self.message_user(request, f"Redrove {len(created)} job(s): {summary or 'none'}.", messages.SUCCESS)
        return None

    @admin.action(description="Purge selected queued jobs…", permissions=["purge"])
    def purge_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        selected = list(queryset.values_list("pk", flat=True))
        queued = list(self.list_rows(purgeable(job_ids=selected)).order_by("id"))  # the service's rule
        skipped = len(selected) - len(queued)
        if confirmed_request_id(request) is None:
            return confirm(self, request, PURGE, rows=job_rows(queued), skipped=skipped)
        count = purge(job_ids=[job.pk for job in queued]) if queued else 0
        remaining = set(Job.objects.filter(pk__in=[job.pk for job in queued]).values_list("pk", flat=True))
        gone = [job for job in queued if job.pk not in remaining]
        if gone:
            self.log_deletions(request, gone)  # type: ignore[arg-type]  # the jobs' events went with them: the admin log keeps who
        self.message_user(request, f"Purged {count} queued job(s).", messages.SUCCESS)
        return None

    # -- detail page and dashboard -----------------------------------------------------------

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        job = super().get_object(request, object_id, from_field)
        if job is not None:
            salt = None if job.cipher_salt is None else bytes(job.cipher_salt)
            values = encrypted_values(request)
            values.shown = job
            job.shown_error = values.job_text(job.last_error, field=LAST_ERROR, salt=salt, job_id=job.pk)
        return job

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        job = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if job is not None:
            binding = IdempotencyBinding.objects.filter(job=job).first()
            redriven_from = Redrive.objects.filter(new_job=job).first()
            history = list(JobEvent.objects.filter(job=job).order_by("id"))
            if not history or history[0].kind != EventKind.ENQUEUED:  # stored only before decision 0013
                details = {"redriven_from": redriven_from.source_id} if redriven_from else None
                history.insert(0, job.enqueued_event(details))
            salt = None if job.cipher_salt is None else bytes(job.cipher_salt)
            values = encrypted_values(request)

            def shown(stored: Any, field: str, limit: int = JSON_DISPLAY_CHARS) -> str:
                return values.job_json(stored, field=field, salt=salt, job_id=job.pk, limit=limit)

            checkpoints = Checkpoint.objects.filter(job=job)
            context.update(
                payload_json=shown(job.payload, PAYLOAD),
                result_json=None if job.result is None else shown(job.result, RESULT),
                events=[(event, values.event_details(event.details, salt=salt, job_id=job.pk)) for event in history],
                checkpoints=[
                    (c, shown(c.value, CHECKPOINT_PREFIX + c.name, CHECKPOINT_DISPLAY_CHARS)) for c in checkpoints
                ],
                redriven_from=redriven_from,
                redriven_to=list(Redrive.objects.filter(source=job).order_by("id")),
                binding=binding,
                binding_live=binding is not None and IdempotencyBinding.objects.live().filter(pk=binding.pk).exists(),
                # A pause touches no job, so it is no event of the timeline: its header says it.
                queue_paused=QueueState.objects.filter(pk=job.queue, paused=True).first(),
            )
        response = super().change_view(request, object_id, form_url, context)
        log_if_viewed(self, request, response)
        return response

    def get_urls(self) -> list[URLPattern]:
        dashboard = path("dashboard/", self.admin_site.admin_view(self.dashboard_view), name="workhorse_dashboard")
        return [dashboard, *super().get_urls()]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """The dashboard (``dashboard.dashboard_view``), for whoever may view jobs."""
        return dashboard_view(self, request)
