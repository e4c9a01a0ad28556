"""The outcome values' bounds, ``retry_after`` on every form of header, ``@task(fail_on=, retry_on=)``
validation and the WORKHORSE_MAX_SNOOZES check: pure, no database."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any

import pytest
from django.core.checks import Error
from django.http import HttpResponse
from django.test import override_settings
from django.utils.datastructures import CaseInsensitiveMapping
from hypothesis import given
from hypothesis import strategies as st

from django_workhorse import (
    Cancel,
    Fail,
    InvalidArgumentError,
    OutcomeValidationError,
    Retry,
    Snooze,
    TaskDefinitionError,
    WorkhorseError,
    retry_after,
    task,
)
from django_workhorse.checks import check_settings
from django_workhorse.conf import MAX_DELAY, MAX_REASON_CHARS, MAX_STORED_DATETIME

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=timezone.utc)
US = timedelta(microseconds=1)


def error_of(call: Any) -> OutcomeValidationError:
    with pytest.raises(OutcomeValidationError) as caught:
        call()
    return caught.value


# -- what they are --------------------------------------------------------------------------------


def test_outcomes_are_base_exceptions_that_an_except_exception_does_not_catch():
    for outcome in (Snooze(timedelta(seconds=1)), Retry(), Cancel("r"), Fail("r")):
        assert isinstance(outcome, BaseException)
        assert not isinstance(outcome, Exception)


def test_the_validation_error_is_a_typed_workhorse_invalid_argument_error():
    assert issubclass(OutcomeValidationError, InvalidArgumentError)
    assert issubclass(OutcomeValidationError, WorkhorseError)
    assert issubclass(OutcomeValidationError, ValueError)
    assert issubclass(TaskDefinitionError, InvalidArgumentError)


# -- Snooze and Retry: delays and instants -----------------------------------------------------------


@pytest.mark.parametrize("delay", [US, timedelta(seconds=1), MAX_DELAY], ids=["1-us", "1-s", "max"])
def test_a_delay_in_bounds_is_accepted_by_snooze_and_retry(delay):
    assert Snooze(delay).delay == delay
    assert Retry(after=delay).after == delay
    assert Snooze(delay).run_at(NOW) == NOW + delay


@pytest.mark.parametrize(
    "delay",
    [MAX_DELAY + US, timedelta(0), -US, timedelta(days=-1), 5, 5.0, "5", True],
    ids=["max+1us", "zero", "-1us", "-1d", "int", "float", "str", "bool"],
)
def test_a_delay_out_of_bounds_is_refused_naming_the_field_and_the_bound(delay):
    for call, field in ((lambda: Snooze(delay), "delay"), (lambda: Retry(after=delay), "after")):
        error = error_of(call)
        assert (error.field, error.bound) == (field, "a timedelta > 0 and at most 365 days, 0:00:00")
        assert str(error).startswith(f"{field} must be a timedelta > 0 and at most 365 days")


def test_snooze_takes_exactly_one_of_delay_and_until():
    for call in (lambda: Snooze(), lambda: Snooze(timedelta(seconds=1), until=NOW)):
        error = error_of(call)
        assert error.field == "delay"
        assert "exactly one" in error.bound


@pytest.mark.parametrize(
    "until",
    [MAX_STORED_DATETIME, NOW, NOW - timedelta(days=1), datetime(9999, 12, 31, 23, 0, tzinfo=timezone.utc)],
    ids=["year-9999-max", "now", "past", "9999-12-31T23"],
)
def test_an_aware_instant_up_to_year_9999_is_accepted(until):
    snooze = Snooze(until=until)
    assert (snooze.until, snooze.run_at(NOW)) == (until, until)


@pytest.mark.parametrize(
    ("until", "bound"),
    [
        (datetime(2030, 1, 1), "an aware datetime (with a time zone)"),
        (datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-1))), "an instant in UTC years 1..9999"),
        ("2030-01-01T00:00:00+00:00", "an aware datetime (with a time zone)"),
        (NOW.date(), "an aware datetime (with a time zone)"),
    ],
    ids=["naive", "past-year-9999-in-utc", "str", "date"],
)
def test_an_instant_that_is_naive_or_past_year_9999_is_refused(until, bound):
    error = error_of(lambda: Snooze(until=until))
    assert (error.field, error.bound) == ("until", bound)


# -- Cancel and Fail: reasons ----------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["", "order was refunded", "é" * MAX_REASON_CHARS], ids=["empty", "text", "max"])
def test_a_storable_reason_up_to_the_bound_is_accepted(reason):
    assert Cancel(reason).reason == reason
    assert Fail(reason).reason == reason
    assert str(Fail(reason)) == reason


@pytest.mark.parametrize(
    ("reason", "bound"),
    [
        ("x" * (MAX_REASON_CHARS + 1), f"0..{MAX_REASON_CHARS} characters"),
        ("x" * 5_000_000, f"0..{MAX_REASON_CHARS} characters"),
        ("bad\x00", "text without NUL characters or lone surrogates"),
        ("bad\udc80", "text without NUL characters or lone surrogates"),
        (None, "a string"),
        (b"bytes", "a string"),
    ],
    ids=["max+1", "megabytes", "nul", "lone-surrogate", "none", "bytes"],
)
def test_an_unstorable_or_long_reason_is_refused(reason, bound):
    for outcome in (Cancel, Fail):
        error = error_of(lambda outcome=outcome: outcome(reason))
        assert (error.field, error.bound) == ("reason", bound)


# -- Retry-After ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "delay"),
    [
        ("120", timedelta(seconds=120)),
        (" 120 ", timedelta(seconds=120)),
        ("1", timedelta(seconds=1)),
        ("007", timedelta(seconds=7)),
        (str(int(MAX_DELAY.total_seconds())), MAX_DELAY),
        (str(int(MAX_DELAY.total_seconds()) + 1), MAX_DELAY),
        ("9" * 5000, MAX_DELAY),
        ("0" * 5000 + "5", timedelta(seconds=5)),
        (b"60", timedelta(seconds=60)),
        (format_datetime(NOW + timedelta(minutes=5), usegmt=True), timedelta(minutes=5)),
        ("Fri, 04 Dec 2026 12:02:00 -0000", timedelta(minutes=2)),
        ("Fri, 04 Dec 2026 13:00:00 +0100", None),  # 12:00 UTC: now, no wait
        ("Fri, 31 Dec 9999 23:59:59 GMT", MAX_DELAY),
    ],
    ids=[
        "delta", "spaces", "one", "leading-zeros", "max", "max+1", "huge", "many-zeros", "bytes",
        "date-future", "date-minus-0000", "date-now-other-zone", "date-year-9999",
    ],
)  # fmt: skip
def test_retry_after_reads_delta_seconds_and_http_dates(value, delay):
    assert retry_after({"Retry-After": value}, now=NOW) == delay


@pytest.mark.parametrize(
    "value",
    [
        "0",
        "-5",
        "1.5",
        "+5",
        "1e3",
        "٣",  # an Arabic-Indic digit: str.isdigit says yes, HTTP says no
        "",
        "   ",
        "soon",
        "Fri, 04 Dec 2026 11:00:00 GMT",  # in the past
        "Mon, 99 Foo 2026 99:99:99 GMT",
        "Fri, 04 Dec 2026 12:00:00 GMT, 120",
        None,
        120,
        ["120"],
    ],
    ids=[
        "zero", "negative", "fraction", "plus", "exponent", "non-ascii-digit", "empty", "blank", "garbage",
        "date-past", "date-garbage", "two-values", "none", "int", "list",
    ],
)  # fmt: skip
def test_retry_after_gives_none_for_what_is_not_a_future_delay(value):
    assert retry_after({"Retry-After": value}, now=NOW) is None


@pytest.mark.parametrize("name", ["Retry-After", "retry-after", "RETRY-AFTER", "rEtRy-AfTeR"])
def test_retry_after_matches_the_header_name_in_any_case(name):
    assert retry_after({name: "30"}, now=NOW) == timedelta(seconds=30)


class Broken:
    def get(self, name: str) -> Any:
        raise RuntimeError("broken mapping")


@pytest.mark.parametrize("headers", [None, {}, {"Content-Type": "text/plain"}, Broken(), "Retry-After: 5", 5])
def test_retry_after_without_a_usable_header_is_none(headers):
    assert retry_after(headers, now=NOW) is None


@given(st.text(max_size=200))
def test_retry_after_never_raises_on_any_text(value):
    delay = retry_after({"Retry-After": value})
    assert delay is None or timedelta(0) < delay <= MAX_DELAY


@given(st.one_of(st.binary(max_size=50), st.integers(), st.none(), st.floats()))
def test_retry_after_never_raises_on_any_value(value):
    delay = retry_after({"retry-after": value})
    assert delay is None or timedelta(0) < delay <= MAX_DELAY


class Response:
    def __init__(self, headers: Any) -> None:
        self.headers = headers


def test_retry_from_response_reads_any_object_with_headers():
    django_response = HttpResponse(status=429, headers={"Retry-After": "90"})
    assert Retry.from_response(django_response).after == timedelta(seconds=90)
    assert Retry.from_response(Response({"retry-after": "5"})).after == timedelta(seconds=5)
    assert Retry.from_response(Response({"Retry-After": "garbage"})).after is None
    assert Retry.from_response(Response(None)).after is None
    assert Retry.from_response(object()).after is None


def test_retry_from_response_reads_a_case_insensitive_mapping_as_http_clients_give():
    # requests' CaseInsensitiveDict and httpx's Headers are such mappings; so is Django's.
    headers = CaseInsensitiveMapping({"RETRY-AFTER": "42"})
    assert Retry.from_response(Response(headers)).after == timedelta(seconds=42)


# -- @task(fail_on=, retry_on=) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [("fail_on", ("ValueError",)), ("fail_on", int), ("retry_on", [ValueError, 1]), ("retry_on", ValueError())],
    ids=["str", "not-an-exception-class", "list-with-int", "instance"],
)
def test_fail_on_and_retry_on_that_are_not_exception_classes_are_refused_at_decoration(option, value):
    with pytest.raises(TaskDefinitionError) as caught:
        task(name="tests.outcomes.bad_options", **{option: value})(lambda: None)
    assert (caught.value.field, caught.value.bound) == (option, "exception classes (subclasses of BaseException)")


def test_fail_on_and_retry_on_take_a_class_a_tuple_or_a_list():
    made = task(name="tests.outcomes.good_options", fail_on=KeyError, retry_on=[OSError, TimeoutError])(lambda: None)
    assert (made.fail_on, made.retry_on) == ((KeyError,), (OSError, TimeoutError))
    plain = task(name="tests.outcomes.no_options")(lambda: None)
    assert (plain.fail_on, plain.retry_on) == ((), None)


# -- WORKHORSE_MAX_SNOOZES (workhorse.E401) --------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 100, 100_000])
def test_check_settings_accepts_max_snoozes_in_bounds(limit):
    with override_settings(WORKHORSE_MAX_SNOOZES=limit):
        assert check_settings() == []


@pytest.mark.parametrize("limit", [0, 100_001, -1, True, "100", 100.0, None], ids=repr)
def test_check_settings_rejects_max_snoozes_out_of_bounds(limit):
    with override_settings(WORKHORSE_MAX_SNOOZES=limit):
        assert check_settings() == [
            Error(f"WORKHORSE_MAX_SNOOZES must be an integer in 1..100000, got {limit!r}.", id="workhorse.E401")
        ]
