"""MkDocs hook: the docstrings' Sphinx roles (``:func:`~a.b.c` ``), which mkdocstrings
leaves as text before the code, read as plain code on the API pages (``c``; the full path
without the ``~``), as Sphinx shows them."""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(
    r":(?:py:)?(?:mod|func|class|meth|data|attr|exc|obj|const):<code>(~?)([^<]*)</code>"
)


def _plain(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if short else target}</code>"


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return ROLE.sub(_plain, html)
