"""What happens to the jobs a write accepted, once it is written: the one step every write path ends with.

Enqueue, ``enqueue_many``, schedule ticks, run-now and the django.tasks backend all call
``after_write``. In eager mode the worker runs the accepted jobs inline
(``django_workhorse.worker.eager``); this room does not know how: the worker registers its inline
runner here when the app is ready (``apps.py``), so enqueueing never imports the worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django_workhorse.types import EnqueueResult

# Whether accepted jobs run inline here and now, and how: set by the worker room (None before).
_active: Callable[[], bool] | None = None
_run: Callable[[str, Sequence[EnqueueResult]], None] | None = None
_run_workflow: Callable[[str, int], None] | None = None


def set_inline_runner(
    active: Callable[[], bool],
    run: Callable[[str, Sequence[EnqueueResult]], None],
    run_workflow: Callable[[str, int], None] | None = None,
) -> None:
    """Register how accepted jobs run inline (eager mode): ``active()`` says whether, ``run`` runs
    them, ``run_workflow`` runs an accepted workflow's steps as they are released."""
    global _active, _run, _run_workflow
    _active, _run, _run_workflow = active, run, run_workflow


def runs_inline() -> bool:
    """Whether a write here runs its accepted jobs before it returns (eager mode)."""
    return _active is not None and _active()


def after_write(alias: str, results: Sequence[EnqueueResult]) -> None:
    """Run the accepted jobs of a write inline when eager mode is on; nothing otherwise."""
    if _run is not None and runs_inline():
        _run(alias, results)


def after_workflow_write(alias: str, workflow_id: int) -> None:
    """Run an accepted workflow's steps inline, each once released, when eager mode is on."""
    if _run_workflow is not None and runs_inline():
        _run_workflow(alias, workflow_id)
