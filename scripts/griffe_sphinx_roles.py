"""Griffe extension of the docs site (mkdocs.yml): Sphinx roles in docstrings become code spans.

A few docstrings write ``:func:`enqueue``` or ``:class:`~pkg.Task```; mkdocstrings would show the
role's text as is. Each becomes a code span of the name Sphinx would display (the last component
after ``~``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|meth|class|exc|attr|mod|data|obj):`(~?)([^`]+)`")


def _code_span(match: re.Match[str]) -> str:
    name = match.group(2).rsplit(".", 1)[-1] if match.group(1) else match.group(2)
    return f"``{name}``"


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_code_span, obj.docstring.value)
