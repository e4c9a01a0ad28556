"""Lists in the docs that name things the code defines: they must name exactly those things.

- docs/settings.md's table has one row per setting of ``django_workhorse.conf.WorkhorseSettings``,
  with its default;
- a paragraph after a ``<!-- tables: ... -->`` comment, in any page, names every table of the app.
"""

from __future__ import annotations

import ast
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.apps import apps

from django_workhorse.conf import Setting, WorkhorseSettings

DOCS = Path(__file__).resolve().parent.parent / "docs"
SETTING_ROW = re.compile(r"^\| `WORKHORSE_(?P<name>[A-Z0-9_]+)` \| `(?P<default>[^`]+)`", re.MULTILINE)
TABLES_MARKER = re.compile(r"<!-- tables:[^>]*-->\n\n(?P<paragraph>(?:.+\n)+)")
TABLE_NAME = re.compile(r"`(workhorse_[a-z_]+)`")
TIMEDELTA = re.compile(r"timedelta\((?P<unit>[a-z]+)=(?P<count>\d+)\)")


def code_settings() -> dict[str, Setting[Any]]:
    return {name: value for name, value in vars(WorkhorseSettings).items() if isinstance(value, Setting)}


def documented_settings() -> dict[str, str]:
    rows = SETTING_ROW.findall((DOCS / "settings.md").read_text())
    names = [name for name, _ in rows]
    assert len(names) == len(set(names)), f"docs/settings.md lists a setting twice: {sorted(names)}"
    return dict(rows)


def literal(text: str) -> Any:
    """A default as the docs write it: a Python literal, or ``timedelta(<unit>=<n>)``."""
    if match := TIMEDELTA.fullmatch(text):
        return timedelta(**{match["unit"]: int(match["count"])})
    return ast.literal_eval(text)


def test_the_settings_page_lists_every_setting_the_code_defines_and_no_other():
    assert set(documented_settings()) == set(code_settings())


def test_the_settings_page_gives_each_setting_the_default_the_code_has():
    defaults = {name: setting.default for name, setting in code_settings().items()}

    documented = {name: literal(text) for name, text in documented_settings().items() if name in defaults}

    assert documented == {name: defaults[name] for name in documented}


def test_every_list_of_tables_in_the_docs_names_every_table_of_the_app():
    tables = {model._meta.db_table for model in apps.get_app_config("workhorse").get_models()}
    lists = {
        (page.relative_to(DOCS).as_posix(), number): set(TABLE_NAME.findall(match["paragraph"]))
        for page in sorted(DOCS.rglob("*.md"))
        for number, match in enumerate(TABLES_MARKER.finditer(page.read_text()))
    }

    assert ("quickstart.md", 0) in lists
    assert lists == dict.fromkeys(lists, tables)
