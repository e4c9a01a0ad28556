"""docs/quickstart.md, run as a reader runs it: every block, in order, in a new project.

Each fenced block of the page follows a marker comment that says what a reader does with it:

- ``<!-- quickstart: run -->``: shell commands, one a line, run in the project's directory;
- ``<!-- quickstart: write PATH -->`` / ``append PATH``: a file of the project, written or extended;
- ``<!-- quickstart: shell -->``: Python typed into ``python manage.py shell``;
- ``<!-- quickstart: page -->``: the text the last form submission(s) answered, line by line;
- ``<!-- quickstart: output COMMAND -->``: lines that the last run of ``COMMAND`` printed.

Markers without a block are the reader's browser: ``submit PATH`` (load the page, send its form),
``submit PATH twice`` (send the same form twice) and ``admin`` (log in, look at the job).

The project is made by ``django-admin startproject`` in a temporary directory, on a database of
its own; ``runserver`` serves it on a free port (restarted when a later block rewrites a file, as
its autoreloader would), and ``workhorse_worker`` runs with ``--burst`` so that it exits once no
job is ready. A command the page shows that this interpreter does not know fails the test.
"""

from __future__ import annotations

import html.parser
import http.cookiejar
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from tests.worker_tasks import wait_for

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "docs" / "quickstart.md"
MARKER = re.compile(r"<!-- quickstart: (?P<action>.+?) -->")
FENCE = re.compile(r"^```(?P<info>.*)$")
SUPERUSER, PASSWORD = "admin", "quickstart-not-secret"
TIMEOUT = 60


@dataclass
class Step:
    action: str
    code: str | None = None  # the fenced block after the marker, if any


def steps(text: str) -> list[Step]:
    """The page's markers in order, each with the block that follows it (unmarked blocks fail)."""
    found: list[Step] = []
    lines = iter(text.splitlines())
    pending: Step | None = None
    for line in lines:
        if marker := MARKER.fullmatch(line.strip()):
            step = Step(marker["action"])
            found.append(step)
            pending = None if step.action.partition(" ")[0] in BROWSER_ACTIONS else step
        elif FENCE.match(line):
            assert pending is not None and pending.code is None, f"a block without a quickstart marker: {line!r}"
            body = []
            for inner in lines:
                if inner.startswith("```"):
                    break
                body.append(inner)
            pending.code = "\n".join(body) + "\n"
            pending = None
        elif line.strip() and pending is not None:
            raise AssertionError(f"marker {pending.action!r} is not followed by its block")
    return found


# Markers that stand for something the reader does (no block follows them).
BROWSER_ACTIONS = ("submit", "admin", "unclaimed")


class _Forms(html.parser.HTMLParser):
    """The named inputs of a page's first form."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, str] = {}
        self.forms = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "form":
            self.forms += 1
        elif tag == "input" and self.forms == 1 and values.get("name"):
            self.fields[values["name"] or ""] = values.get("value") or ""


class Browser:
    """A cookie-keeping HTTP client, standing in for the reader's browser."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=TIMEOUT) as response:
            return response.read().decode()

    def post(self, path: str, fields: dict[str, str]) -> str:
        data = urllib.parse.urlencode(fields).encode()
        with self.opener.open(self.base + path, data=data, timeout=TIMEOUT) as response:
            return response.read().decode()

    def form(self, path: str) -> dict[str, str]:
        parser = _Forms()
        parser.feed(self.get(path))
        assert parser.forms >= 1, f"no form on {path}"
        return parser.fields


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def accepts_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture
def database() -> Iterator[dict[str, Any]]:
    """A new, empty database on the test server, for the quickstart project; dropped afterwards."""
    server = settings.DATABASES["default"]
    params = {
        "host": server["HOST"],
        "port": server["PORT"],
        "user": server["USER"],
        "password": server["PASSWORD"],
    }
    name = f"quickstart_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {**params, "dbname": name}
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Reader:
    """Runs the steps of the page in ``home`` (``cwd`` after ``cd``)."""

    home: Path
    database: dict[str, Any]
    log_dir: Path
    cwd: Path = field(init=False)
    server: subprocess.Popen[bytes] | None = None
    port: int = 0
    files_changed: bool = False
    database_override: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    answers: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cwd = self.home
        env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL"}}
        # This checkout's django_workhorse, whatever the virtualenv has installed.
        self.env = {**env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}

    # -- shell commands -----------------------------------------------------------------------

    def run_block(self, code: str) -> None:
        for line in code.splitlines():
            if line.strip():
                self.command(shlex.split(line))

    def command(self, words: list[str]) -> None:
        match words:
            case ["pip", "install", *packages]:
                assert packages == ["django-workhorse"], "the quickstart installs the package by its name"
            case ["django-admin", *args]:
                self.python(["-m", "django", *args])
                if args[0] == "startproject":
                    self.configure_database(self.cwd / args[1])
            case ["cd", directory]:
                self.cwd = self.cwd / directory
            case ["python", "manage.py", "runserver"]:
                self.start_server()
            case ["python", "manage.py", "workhorse_worker", *options]:
                self.python(["manage.py", "workhorse_worker", *options, "--burst"])
            case ["python", "manage.py", "createsuperuser"]:
                env = {"DJANGO_SUPERUSER_PASSWORD": PASSWORD}
                self.python(["manage.py", "createsuperuser", "--no-input", "--username", SUPERUSER, "--email", ""], env)
            case ["python", "manage.py", name, *args]:
                self.outputs[name] = self.python(["manage.py", name, *args])
            case _:
                raise AssertionError(f"the quickstart runs {shlex.join(words)!r}: teach tests/test_quickstart.py")

    def python(self, args: list[str], env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            [sys.executable, *args],
            cwd=self.cwd,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert done.returncode == 0, f"{shlex.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def configure_database(self, project: Path) -> None:
        """Keep a note: after the page's DATABASES block, point it at this test's database."""
        self.database_override = (
            "\n# tests/test_quickstart.py: the test's database server instead of the page's.\n"
            f'DATABASES["default"].update(NAME={self.database["dbname"]!r}, USER={self.database["user"]!r}, '
            f"PASSWORD={self.database['password']!r}, HOST={self.database['host']!r}, "
            f"PORT={str(self.database['port'])!r})\n"
        )

    # -- files ------------------------------------------------------------------------------

    def write(self, path: str, code: str, *, append: bool = False) -> None:
        target = self.cwd / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.endswith("settings.py") and "DATABASES" in code:
            code += self.database_override
        if append:
            assert target.exists(), f"the quickstart appends to {path}, which does not exist yet"
            separator = "\n\n" if path.endswith(".py") else ""  # two blank lines before a definition
            code = target.read_text() + separator + code
        target.write_text(code)
        self.files_changed = True

    # -- the browser --------------------------------------------------------------------------

    def start_server(self) -> None:
        self.stop_server()
        self.port = free_port()
        with (self.log_dir / f"runserver-{self.port}.log").open("wb") as log:
            self.server = subprocess.Popen(
                [sys.executable, "manage.py", "runserver", f"127.0.0.1:{self.port}", "--noreload"],
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=log,
            )
        wait_for(lambda: accepts_connections(self.port), TIMEOUT, what="runserver to accept connections")
        self.files_changed = False

    def stop_server(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            self.server.wait(TIMEOUT)

    def browser(self) -> Browser:
        assert self.server is not None, "the quickstart uses the browser before it starts runserver"
        if self.files_changed:  # runserver's autoreloader would have restarted it
            self.start_server()
        return Browser(f"http://127.0.0.1:{self.port}")

    def submit(self, path: str, times: int) -> None:
        browser = self.browser()
        fields = browser.form(path)
        self.answers = [browser.post(path, fields) for _ in range(times)]

    def admin(self) -> str:
        browser = self.browser()
        fields = browser.form("/admin/login/")
        browser.post("/admin/login/?next=/admin/", {**fields, "username": SUPERUSER, "password": PASSWORD})
        return browser.get("/admin/workhorse/job/")

    # -- the steps --------------------------------------------------------------------------

    def do(self, step: Step) -> None:
        action, code = step.action, step.code
        verb, _, argument = action.partition(" ")
        if verb == "run":
            self.run_block(code or "")
        elif verb in ("write", "append"):
            self.write(argument, code or "", append=verb == "append")
        elif verb == "shell":
            self.python(["manage.py", "shell", "--command", code or ""])
        elif verb == "submit":
            path, _, twice = argument.partition(" ")
            self.submit(path, 2 if twice == "twice" else 1)
        elif verb == "page":
            assert self.answers == (code or "").splitlines(), "the page's answers differ from the quickstart's"
        elif verb == "output":
            printed = self.outputs[argument].splitlines()
            for line in (code or "").splitlines():
                assert _shape(line) in {_shape(p) for p in printed}, f"{argument} printed no line like {line!r}"
        elif verb == "unclaimed":
            # "The worker started above leaves this job queued": a worker without --queues.
            self.python(["manage.py", "workhorse_worker", "--burst"])
            newest = rows(self.database, "SELECT queue, status FROM workhorse_job ORDER BY id DESC LIMIT 1")
            assert newest == [(argument, "queued")], newest
        elif verb == "admin":
            page = self.admin()
            assert "shop.send_confirmation" in page and "succeeded" in page.lower(), page
        else:
            raise AssertionError(f"unknown quickstart marker {action!r}")


def _shape(line: str) -> str:
    """A printed line with its rates (``0.02 jobs/min``) blurred: they depend on the clock."""
    return re.sub(r"\d+\.\d+ jobs/min", "N jobs/min", line.strip())


def rows(database: dict[str, Any], query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(**database) as conn:
        return conn.execute(query).fetchall()


def test_every_block_of_the_quickstart_has_a_marker_this_test_understands():
    found = steps(QUICKSTART.read_text())

    verbs = {step.action.partition(" ")[0] for step in found}
    assert verbs <= {"run", "write", "append", "shell", "submit", "page", "output", "admin", "unclaimed"}
    assert sum(step.code is not None for step in found) == QUICKSTART.read_text().count("\n```") // 2


def test_the_quickstart_runs_from_install_to_a_succeeded_job(tmp_path, database):
    home = tmp_path / "reader"
    home.mkdir()
    reader = Reader(home, database, tmp_path)
    try:
        for step in steps(QUICKSTART.read_text()):
            reader.do(step)
    finally:
        reader.stop_server()

    # What the page promised: the orders confirmed, one confirmation per order, the receipt run
    # (the batch's receipts were purged).
    assert rows(database, "SELECT id, confirmed FROM shop_order ORDER BY id") == [(1, True), (2, True)]
    jobs = rows(database, "SELECT job_type, queue, status FROM workhorse_job ORDER BY id")
    assert jobs == [
        ("shop.send_confirmation", "default", "succeeded"),
        ("shop.send_confirmation", "default", "succeeded"),
        ("shop.send_receipt", "mail", "succeeded"),
    ]
