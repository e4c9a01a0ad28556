"""The handler registry: register, get_handler, replacement, resolvers and unknown job types."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_workhorse.exceptions import HandlerNotRegisteredError
from django_workhorse.tasks import registry
from django_workhorse.tasks.registry import Handler, get_handler, register


@pytest.fixture(autouse=True)
def empty_registry(monkeypatch) -> Iterator[None]:
    """Each test starts with no handlers and no resolvers; the real ones come back afterwards."""
    monkeypatch.setattr(registry, "_handlers", {})
    monkeypatch.setattr(registry, "_resolvers", [])
    monkeypatch.setattr(registry, "_task_backends_imported", True)
    yield


def test_get_handler_returns_what_register_registered():
    def handle(payload: Any) -> Any:
        return payload

    register("tests.echo", handle)
    handler = get_handler("tests.echo")
    assert (handler.job_type, handler.func, handler.takes_context, handler.spreads_payload) == (
        "tests.echo",
        handle,
        False,
        False,
    )
    assert handler.call({"a": 1}, context=None) == {"a": 1}


def test_registering_a_job_type_again_replaces_its_handler():
    register("tests.t", lambda payload: "first")
    register("tests.t", lambda payload: "second")
    assert get_handler("tests.t").call(None, None) == "second"


def test_a_handler_with_a_context_parameter_gets_the_context_first():
    @register("tests.ctx")
    def handle(ctx: Any, payload: Any) -> Any:
        return (ctx, payload)

    assert get_handler("tests.ctx").call("p", "c") == ("c", "p")


def test_an_unknown_job_type_raises_naming_it():
    register("tests.known", lambda payload: None)
    with pytest.raises(HandlerNotRegisteredError) as info:
        get_handler("tests.unknown")
    assert "tests.unknown" in str(info.value)


def test_a_resolver_supplies_an_unknown_type_once_and_it_is_kept():
    calls: list[str] = []

    def resolve(job_type: str) -> Handler | None:
        calls.append(job_type)
        return Handler(job_type, lambda payload: job_type, takes_context=False, spreads_payload=False)

    registry.add_resolver(resolve)
    registry.add_resolver(resolve)  # added once
    assert get_handler("tests.resolved").call(None, None) == "tests.resolved"
    assert get_handler("tests.resolved").call(None, None) == "tests.resolved"
    assert calls == ["tests.resolved"]


def test_a_resolver_that_knows_nothing_leaves_the_type_unknown():
    registry.add_resolver(lambda job_type: None)
    with pytest.raises(HandlerNotRegisteredError):
        get_handler("tests.nobody")
