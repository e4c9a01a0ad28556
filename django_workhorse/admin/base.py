"""What every admin of the app shares: the checked list, its query-string checks, who acts and may act.

A list's query string is checked before any SQL runs (``check_query``): a parameter PostgreSQL
cannot take (NUL, a non-integer or out-of-range number for an integer field) is an incorrect lookup,
which Django answers with the unfiltered list flagged ``?e=1``.
"""

from __future__ import annotations

import re
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import IGNORED_PARAMS, ChangeList
from django.core.exceptions import FieldDoesNotExist
from django.db import DataError, connections, router, transaction
from django.db.models import ForeignKey, IntegerField, Model, Q, QuerySet
from django.http import HttpRequest, QueryDict

from django_workhorse import conf
from django_workhorse.enqueueing.storable import check_text

INTEGER = re.compile(r"[+-]?[0-9]{1,20}")
# Lookups whose values are numbers of the field's type (``in`` takes a comma-separated list).
NUMERIC_LOOKUPS = frozenset({"", "exact", "in", "gt", "gte", "lt", "lte"})


def actor(request: HttpRequest) -> str:
    """Who did it, as recorded in job events: ``admin:<username>``."""
    return f"admin:{request.user.get_username()}"


def has_permission(request: HttpRequest, permission: str) -> bool:
    """Whether the request's user is active staff holding the app's ``permission``."""
    return bool(request.user.is_active and request.user.is_staff and request.user.has_perm(f"workhorse.{permission}"))


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
    """An admin whose lists check their query string (``CheckedChangeList``)."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return CheckedChangeList

    def list_rows(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """What a list loads of each row (and of the rows its actions get); all fields by default."""
        return queryset

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if (matches := self.search_matches(term)) is None:
            return super().get_search_results(request, queryset, search_term)
        return queryset.filter(matches), False

    def search_matches(self, term: str) -> Q | None:
        """What a search for ``term`` (stripped, not empty) matches; None: Django's search of ``search_fields``."""
        return None


class ReadOnlyAdmin(CheckedAdmin):
    """Base of the app's admins: nothing is added, changed or deleted by hand.

    What an operator may change goes through actions, each behind its own permission (deleting too:
    purge for queued jobs, release for bindings).
    """

    change_list_template = "admin/workhorse/change_list.html"  # cells cut to fit (``display.cut``)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class YesNoFilter(admin.SimpleListFilter):
    """A filter with two choices: rows matching ``condition()``, or the others."""

    two_choices: tuple[tuple[str, str], tuple[str, str]]  # (value, label) of "matching", then of "not matching"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(self.two_choices)

    def condition(self) -> Any:
        """The ``Q`` or ``Exists`` a matching row satisfies."""
        raise NotImplementedError

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        (matching, _), (others, _) = self.two_choices
        if self.value() == matching:
            return queryset.filter(self.condition())
        if self.value() == others:
            return queryset.exclude(self.condition())
        return queryset
