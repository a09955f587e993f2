"""The building blocks of a report: sections of paragraphs, tables and figures.

Plain dataclasses (no pandas, no matplotlib): the section builders produce them and
:mod:`cogcal.report.render` turns them into Markdown and HTML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cogcal._constraints import Real


@dataclass
class Link:
    """Inline text linking to the anchor ``key`` of a table or section of the report."""

    text: str
    key: str


#: Inline text: a string, or a list of strings and links.
Text = str | list[str | Link]


@dataclass
class Cell:
    """One table cell: text, bold when best."""

    text: str
    bold: bool = False


@dataclass
class Table:
    """A table independent of the output format; ``key`` is its anchor."""

    title: str
    header: list[str]
    rows: list[list[Cell]]
    notes: list[Text] = field(default_factory=list)
    key: str = ""


@dataclass
class Paragraph:
    """A paragraph of text (``items`` makes it a bullet list); text may hold links."""

    text: Text = ""
    items: list[Text] = field(default_factory=list)


@dataclass
class Figure:
    """An image file (PNG) with a caption; ``path`` is relative to the report folder."""

    path: str
    caption: str


@dataclass
class Section:
    """A titled section holding paragraphs, tables, figures and subsections; ``key`` is
    its anchor (sections with a key are listed in the HTML table of contents)."""

    title: str
    blocks: list[Paragraph | Table | Figure | Section] = field(default_factory=list)
    key: str = ""


#: What :func:`num` shows as a number: a finite real (not a bool).
_FINITE = Real()


def num(value: Any, digits: int = 4) -> str:
    """A number with ``digits`` decimals; ``—`` for a missing or non-finite one.

    >>> num(0.12345), num(float("nan")), num(None), num(2, 1)
    ('0.1235', '—', '—', '2.0')
    """
    return f"{value:.{digits}f}" if _FINITE.problem(value) is None else "—"


def plain(value: Any) -> str:
    """A value as text for a reader (never a Python repr of a dict or list).

    >>> plain(None), plain(True), plain(1e-4), plain([1, 2]), plain({"a": 1, "b": None})
    ('—', 'yes', '0.0001', '1, 2', 'a 1; b —')
    """
    if value is None or (isinstance(value, float) and value != value):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return "; ".join(f"{k} {plain(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(plain(v) for v in value)
    return str(value)
