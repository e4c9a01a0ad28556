"""The typed errors: all in one module, all importable from the package, all WorkhorseErrors."""

from __future__ import annotations

import inspect

import django_workhorse
from django_workhorse import exceptions


def _error_classes() -> dict[str, type[BaseException]]:
    return {
        name: value
        for name, value in vars(exceptions).items()
        if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == exceptions.__name__
    }


def test_every_error_is_exported_by_the_package_and_is_a_workhorse_error():
    errors = _error_classes()
    assert {"WorkhorseError", "InvalidArgumentError", "WorkerThreadError"} <= errors.keys()
    for name, error in errors.items():
        assert getattr(django_workhorse, name) is error, name
        assert name in django_workhorse.__all__, name
        assert issubclass(error, django_workhorse.WorkhorseError), name


def test_no_module_of_the_package_defines_an_error_of_its_own():
    import pkgutil
    from importlib import import_module

    for info in pkgutil.walk_packages(django_workhorse.__path__, "django_workhorse."):
        if ".migrations" in info.name or info.name.endswith(".exceptions"):
            continue
        module = import_module(info.name)
        own = [
            name
            for name, value in vars(module).items()
            if inspect.isclass(value) and issubclass(value, Exception) and value.__module__ == module.__name__
        ]
        assert own == [], f"{info.name} defines {own}"
