"""A supervisor's child process: who it is, and its reports to the supervisor (``worker.supervisor``)."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from django_workhorse import sql

logger = logging.getLogger(__name__)

# The environment variable that makes a process a supervisor's child: JSON with its name, its
# supervisor's name and the descriptors of its report pipe and of the supervisor's lifeline.
CHILD_ENVIRONMENT = "WORKHORSE_SUPERVISED_CHILD"


@dataclass(frozen=True)
class ChildIdentity:
    """Who a child process is, as its supervisor said in ``CHILD_ENVIRONMENT``."""

    name: str
    supervisor: str
    reports: int
    lifeline: int


def child_identity() -> ChildIdentity | None:
    """Return this process's identity if a supervisor started it, else None. Removes the variable
    from the environment, so the handlers' own subprocesses never take themselves for children."""
    text = os.environ.pop(CHILD_ENVIRONMENT, None)
    if text is None:
        return None
    fields = json.loads(text)
    return ChildIdentity(fields["name"], fields["supervisor"], int(fields["reports"]), int(fields["lifeline"]))


class ChildReporter:
    """The child's end of the report pipe: tells the supervisor when attempts start and end
    (a ``Worker``'s observer), and stops the worker if the supervisor goes away."""

    def __init__(self, identity: ChildIdentity) -> None:
        self.identity = identity

    def started(self, job: sql.claims.ClaimedJob) -> None:
        """The handler of ``job`` is about to run."""
        timeout = None if job.timeout is None else job.timeout.total_seconds()
        self._say({"started": job.id, "token": str(job.lease_token), "timeout": timeout})

    def ended(self, job: sql.claims.ClaimedJob) -> None:
        """The attempt of ``job`` ended."""
        self._say({"ended": job.id})

    def recycling(self) -> None:
        """This child exits to be replaced (it reached --max-jobs-per-child)."""
        self._say({"recycling": True})

    def watch_supervisor(self, stop: Callable[[], None]) -> None:
        """Call ``stop`` (a drain) when the supervisor's lifeline closes: it died, so no one would
        replace this child or stop it."""

        def watch() -> None:
            while os.read(self.identity.lifeline, 1):
                pass
            logger.warning("The supervisor is gone; stopping this child")
            stop()

        threading.Thread(target=watch, name="workhorse-lifeline", daemon=True).start()

    def _say(self, message: dict[str, Any]) -> None:
        # One short line per write: atomic on a pipe, so executor threads never interleave.
        with suppress(OSError):  # the supervisor is gone; the lifeline stops this child
            os.write(self.identity.reports, (json.dumps(message) + "\n").encode())
