"""``manage.py workhorse_queue``: pause, resume or drain a queue, or list the paused ones.

``drain`` pauses the queue and waits until none of its jobs is running: exit 0 when drained, 1 on
timeout (the queue stays paused), a pre-deploy hook. ``pause --wait`` is the same as ``drain``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_workhorse.exceptions import DrainTimeoutError, InvalidArgumentError
from django_workhorse.management.arguments import seconds
from django_workhorse.observability.log_fields import printable
from django_workhorse.operations.queues import (
    DEFAULT_DRAIN_POLL,
    MAX_DRAIN_TIMEOUT,
    DrainProgress,
    drain_queue,
    pause_queue,
    paused_queues,
    resume_queue,
)

ACTIONS = ("pause", "resume", "drain", "list")
DEFAULT_TIMEOUT = 600.0


class Command(BaseCommand):
    help = (
        "Pause, resume or drain a queue, or list the paused queues. A paused queue's jobs stay queued: "
        "no worker claims them until it is resumed; running jobs run on. drain pauses the queue, then waits "
        "until none of its jobs is running (exit 1 if --timeout passes first; the queue stays paused)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=ACTIONS, help="What to do.")
        parser.add_argument("queue", nargs="?", default=None, help="The queue (not with list).")
        parser.add_argument("--wait", action="store_true", help="With pause: wait as drain does (drain always waits).")
        parser.add_argument(
            "--timeout",
            type=seconds(0, MAX_DRAIN_TIMEOUT),
            default=DEFAULT_TIMEOUT,
            metavar="S",
            help=f"How long drain waits, in seconds (default {DEFAULT_TIMEOUT:g}).",
        )
        parser.add_argument(
            "--poll",
            type=seconds(0.01, 60),
            default=DEFAULT_DRAIN_POLL,
            metavar="S",
            help=f"How often drain checks, in seconds (default {DEFAULT_DRAIN_POLL:g}).",
        )
        parser.add_argument("--by", default="", metavar="NAME", help="Who asks (recorded with the pause or resume).")
        parser.add_argument("--database", default=None, help="Database alias (default: the router's choice).")

    def handle(
        self,
        *args: Any,
        action: str,
        queue: str | None,
        wait: bool,
        timeout: float,
        poll: float,
        by: str,
        database: str | None,
        verbosity: int,
        **options: Any,
    ) -> None:
        if action == "list":
            if queue is not None:
                raise CommandError("list takes no queue.")
            self._list(database)
            return
        if queue is None:
            raise CommandError(f"{action} needs a queue.")
        if action == "resume" and wait:
            raise CommandError("--wait goes with pause or drain, not resume.")
        try:
            if action == "drain" or wait:
                self._drain(queue, timeout=timeout, poll=poll, by=by, database=database, verbosity=verbosity)
            elif action == "pause":
                change = pause_queue(queue, by=by, using=database)
                since = f"was paused already (since {_utc(change.changed_at)})"
                self._say(verbosity, f"Queue {printable(queue)} {'is paused' if change.changed else since}.")
            else:
                change = resume_queue(queue, by=by, using=database)
                self._say(
                    verbosity, f"Queue {printable(queue)} {'is resumed' if change.changed else 'was not paused'}."
                )
        except InvalidArgumentError as exc:
            raise CommandError(str(exc)) from exc

    def _drain(self, queue: str, *, timeout: float, poll: float, by: str, database: str | None, verbosity: int) -> None:
        shown = printable(queue)
        last: list[tuple[int, int]] = []

        def progress(check: DrainProgress) -> None:
            state = (len(check.running), check.waiting_transactions)
            if verbosity and not check.drained and (not last or last[-1] != state):
                self.stderr.write(_progress_line(shown, check))
            last.append(state)

        try:
            done = drain_queue(queue, timeout=timeout, poll=poll, by=by, using=database, on_progress=progress)
        except DrainTimeoutError as exc:
            raise CommandError(
                f"{exc}. Resume it with: manage.py workhorse_queue resume {shown}", returncode=1
            ) from exc
        self._say(verbosity, f"Queue {shown} is paused and drained: no job of it is running ({done.waited:.1f} s).")

    def _list(self, database: str | None) -> None:
        queues = paused_queues(using=database)
        if not queues:
            self.stdout.write("No queue is paused.")
            return
        for state in queues:
            who = f" by {printable(state.changed_by)}" if state.changed_by else ""
            self.stdout.write(f"{printable(state.queue)}  paused since {_utc(state.changed_at)}{who}")

    def _say(self, verbosity: int, line: str) -> None:
        if verbosity:
            self.stdout.write(line)


def _utc(value: datetime) -> str:
    return f"{value.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"


def _progress_line(queue: str, check: DrainProgress) -> str:
    jobs = ", ".join(map(str, check.running[:10])) + (" …" if len(check.running) > 10 else "")
    parts = [f"{len(check.running)} running ({jobs})" if check.running else "none running"]
    if check.waiting_transactions:
        parts.append(f"waiting for {check.waiting_transactions} transaction(s) older than the pause")
    return f"Draining {queue}: {'; '.join(parts)} after {check.waited:.1f} s"
