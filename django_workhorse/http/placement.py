"""Where ``@idempotent`` may sit: only where the request's user is already known.

A record belongs to an owner (by default the authenticated user). Above DRF's view machinery
(on ``APIView.as_view()``, above ``@api_view``, on ``dispatch``) the decorator sees Django's
request before DRF has authenticated it: every client would be the same anonymous owner, and a
replay would be answered before ``IsAuthenticated`` runs. Those placements are refused with
``IdempotentViewError``: at decoration where the view says what it is, else on its first request.

DRF is optional: when ``rest_framework.views`` has not been imported, no view is a DRF view, and
nothing is imported here to find out.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from django_workhorse.exceptions import IdempotentViewError

# DRF's methods that run before it authenticates the request (or around the handler, not as it).
_DRF_MACHINERY = frozenset({"dispatch", "initialize_request", "initial", "finalize_response", "handle_exception"})
_BOUND = (
    "a view function, a view method (post, create...) or a DRF handler: below @api_view, or on the "
    "view's handler, where authentication has run"
)


def check_view(view: Any) -> None:
    """Refuse, at decoration, a view on which the decorator would run before authentication."""
    if inspect.isclass(view):
        raise IdempotentViewError(
            field="view", bound=_BOUND + " (decorate a class's handler, or use method_decorator(name='post'))"
        )
    api_view = _api_view_class()
    if api_view is None:
        return
    view_class = getattr(view, "view_class", None) or getattr(view, "cls", None)
    if inspect.isclass(view_class) and issubclass(view_class, api_view):
        raise IdempotentViewError(
            field="view", bound=_BOUND + f" ({view_class.__name__} is a DRF view: above it, every request is anonymous)"
        )
    instance = _bound_instance(view)
    if isinstance(instance, api_view) and getattr(view, "__name__", "") in _DRF_MACHINERY:
        raise IdempotentViewError(
            field="view",
            bound=_BOUND + f" ({type(instance).__name__}.{view.__name__} runs before DRF authenticates the request)",
        )


def check_request(view: Any, args: tuple[Any, ...], request: Any) -> None:
    """Refuse, on a request, a DRF view's method that got Django's request instead of DRF's.

    That is a method DRF calls before it authenticates (``dispatch`` decorated directly, in the
    class body); a handler always gets DRF's ``Request``.
    """
    api_view = _api_view_class()
    if api_view is None:
        return
    instance = args[0] if len(args) > 1 else _bound_instance(view)
    if isinstance(instance, api_view) and not _is_drf_request(request):
        name = getattr(view, "__name__", "the view")
        raise IdempotentViewError(
            field="view",
            bound=_BOUND + f" ({type(instance).__name__}.{name} got the request before DRF authenticated it)",
        )


def _api_view_class() -> type | None:
    module = sys.modules.get("rest_framework.views")
    return getattr(module, "APIView", None) if module is not None else None


def _is_drf_request(request: Any) -> bool:
    module = sys.modules.get("rest_framework.request")
    request_class = getattr(module, "Request", None) if module is not None else None
    return request_class is not None and isinstance(request, request_class)


def _bound_instance(view: Any) -> Any:
    """The instance a bound method (or ``method_decorator``'s partial of one) belongs to, if any."""
    function = getattr(view, "func", view)  # method_decorator hands decorators a partial
    return getattr(function, "__self__", None)
