"""Raw SQL lives in the django_workhorse.sql package and nowhere else in the package (STYLE P9)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import django_workhorse

PACKAGE = Path(django_workhorse.__file__).resolve().parent
SQL_PACKAGE = PACKAGE / "sql"
# Calls that send SQL text (or open the cursor that would): only the sql package may make them.
RAW_SQL_METHODS = {"execute", "executemany", "raw", "extra", "cursor"}
RAW_SQL_NAMES = {"RawSQL"}
SQL_STATEMENT = re.compile(
    r"\bINSERT\s+INTO\b|\bDELETE\s+FROM\b|\bUPDATE\s+\S+\s+(?:AS\s+\S+\s+)?SET\b|\bTRUNCATE\b"
    r"|\bSELECT\b[\s\S]*\bFROM\b|\bON\s+CONFLICT\b|\bFOR\s+UPDATE\b"
    r"|(?i:\b(?:into|update|from|join)\s+workhorse_\w+)|(?i:\b(?:pg_notify|nextval)\s*\()"
)


def _python_files() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if SQL_PACKAGE not in path.parents and "migrations" not in path.relative_to(PACKAGE).parts
    )


def _docstring_nodes(tree: ast.Module) -> set[int]:
    """Return the ids of the docstring nodes (prose may describe SQL; code strings may not)."""
    owners = [
        tree,
        *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))),
    ]
    return {
        id(owner.body[0].value)
        for owner in owners
        if owner.body and isinstance(owner.body[0], ast.Expr) and isinstance(owner.body[0].value, ast.Constant)
    }


def _string_texts(tree: ast.Module) -> list[tuple[int, str]]:
    """Return every non-docstring string literal; an f-string is read whole, ``{...}`` as ``{}``."""
    skip = _docstring_nodes(tree)
    texts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in node.values)
            texts.append((node.lineno, "".join(p.value if isinstance(p, ast.Constant) else "{}" for p in node.values)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            texts.append((node.lineno, node.value))
    return texts


def raw_sql_uses(source: str) -> list[str]:
    """Return a line-numbered description of every raw SQL call, import or statement text in ``source``."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in RAW_SQL_METHODS:
            found.append(f"{node.lineno}: .{node.func.attr}(")
        elif getattr(node, "id", None) in RAW_SQL_NAMES or getattr(node, "attr", None) in RAW_SQL_NAMES:
            found.append(f"{node.lineno}: RawSQL")
        elif isinstance(node, ast.alias) and node.name.rsplit(".", 1)[-1] in RAW_SQL_NAMES:
            found.append(f"{node.lineno}: import {node.name}")
    found.extend(f"{line}: {m.group()!r}" for line, text in _string_texts(tree) if (m := SQL_STATEMENT.search(text)))
    return found


def test_package_has_no_raw_sql_outside_the_sql_package():
    offenders = {
        str(path.relative_to(PACKAGE)): uses for path in _python_files() if (uses := raw_sql_uses(path.read_text()))
    }
    assert offenders == {}


def test_scan_covers_package_modules_recursively():
    names = {str(path.relative_to(PACKAGE)) for path in _python_files()}
    assert {
        "enqueueing/api.py",
        "operations/maintenance.py",
        "models/jobs.py",
        "management/commands/workhorse_maintenance.py",
    } <= names
    assert not names & {"sql/__init__.py", "sql/claims.py", "migrations/0001_initial.py"}


def test_scan_finds_the_statements_of_the_sql_package():
    uses = {path.name: raw_sql_uses(path.read_text()) for path in SQL_PACKAGE.glob("*.py")}
    assert any(".execute(" in use for use in uses["connection.py"])
    assert any("INSERT INTO" in use for use in uses["enqueue.py"])
    assert any("FOR UPDATE" in use for use in uses["claims.py"])


@pytest.mark.parametrize(
    "source",
    [
        "cursor.execute(query)",
        "conn.executemany(query, rows)",
        "Job.objects.raw(query)",
        "Job.objects.extra(where=['1=1'])",
        "connection.cursor()",
        "from django.db.models.expressions import RawSQL",
        "import django.db.models.expressions.RawSQL as R",
        "expressions.RawSQL(query, [])",
        "q = 'INSERT INTO workhorse_job (id) VALUES (1)'",
        "q = 'UPDATE workhorse_job SET status = 1'",
        "q = 'UPDATE workhorse_binding AS b SET job_id = 1'",
        "q = 'DELETE FROM workhorse_binding'",
        "q = 'SELECT id\\n FROM t'",
        "q = 'delete from workhorse_job_event'",
        "q = f'SELECT {x} FROM workhorse_job'",
        "q = f'SELECT {columns} FROM {table}'",
        "q = \"SELECT pg_notify(%s, '')\"",
    ],
)
def test_scan_flags_raw_sql(source):
    assert raw_sql_uses(source) != []


@pytest.mark.parametrize(
    "source",
    [
        '"""Claim with UPDATE ... SET, INSERT INTO ... ON CONFLICT, DELETE FROM workhorse_job."""',
        "def f():\n    'Runs SELECT id FROM workhorse_job via sql.py.'\n    return sql.claim(alias)",
        "db_table = 'workhorse_job'",
        "Job.objects.filter(status='queued').update(status='running')",
        "message = 'Select the jobs to update from the list'",
    ],
)
def test_scan_ignores_docstrings_and_orm_calls(source):
    assert raw_sql_uses(source) == []
