"""MkDocs hook: ``docs/configuration.md``'s marker becomes the reference of every key of a
parameters file, generated from the models that validate it
(:func:`camelyon_proxyfl.params.reference.reference_markdown`)."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- the parameters' reference, generated -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from camelyon_proxyfl.params.reference import reference_markdown

    return markdown.replace(MARKER, reference_markdown())
