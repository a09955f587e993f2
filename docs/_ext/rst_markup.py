"""A Griffe extension for the docs site: the reST markup of cogcal's docstrings as Markdown.

cogcal's docstrings are numpy-style (the sections griffe's numpy parser reads) written with
Sphinx markup inside: cross-reference roles (``:class:`Temperature```), inline math
(``:math:`\\theta```), ``.. math::`` blocks and ``text::`` literal blocks. mkdocstrings
renders docstrings as Markdown, where that markup would show as raw text. Before any
docstring is parsed, this extension rewrites, in every docstring of the loaded package:

* a role ``:class:`X```, ``:func:``, ``:meth:``, ``:mod:``, ``:attr:``, ``:data:``,
  ``:exc:``, ``:obj:`` (``~`` shows the last component only) as an *optional*
  cross-reference: a link where ``X`` is rendered somewhere on the site, plain code
  otherwise (so a reference to a private helper never breaks ``mkdocs build --strict``).
  ``X`` is resolved in the docstring's own scope, as Python (and Sphinx) would;
* ``:math:`...``` as inline math and a ``.. math::`` block as a display block, for
  ``pymdownx.arithmatex`` (generic mode);
* ``text::`` followed by an indented block as ``text:`` and a fenced code block.

A class whose docstring is an expression (``__doc__ = ...``) gets the docstring Python
builds, imported at build time (the package must be importable: ``pip install -e .``).

Configured in ``mkdocs.yml`` (``extensions`` of the mkdocstrings Python handler); the
source files are not changed, and ``help()`` and the doctests see the docstrings as written.
"""

from __future__ import annotations

import html
import inspect
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|attr|data|exc|obj):`(~?)([^`]+?)`")
_MATH = re.compile(r":math:`([^`]+?)`")
_LITERAL = re.compile(r"^(?P<text>.*\S)::$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _block(lines: list[str], start: int, base: int) -> tuple[list[str], int]:
    """The lines indented deeper than ``base`` from ``start`` on (blank lines inside kept),
    and the index after them (trailing blank lines not included)."""
    while start < len(lines) and not lines[start].strip():
        start += 1
    end = i = start
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
        i += 1
        if lines[i - 1].strip():
            end = i
    return lines[start:end], end


def _blocks(text: str) -> str:
    """``.. math::`` and ``text::`` literal blocks as Markdown."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        base = _indent(line)
        math = stripped == ".. math::"
        literal = None if stripped.startswith("..") else _LITERAL.match(stripped)
        if math or literal:
            body, after = _block(lines, i + 1, base)
            if not body:  # not a block after all
                out.append(line)
                i += 1
                continue
            i = after
            pad = " " * base
            depth = min(_indent(b) for b in body if b.strip())
            body = [b[depth:] if b.strip() else "" for b in body]
            if literal:
                out += [f"{pad}{literal['text']}:", "", f"{pad}```text"]
                out += [f"{pad}{b}" if b else "" for b in body] + [f"{pad}```"]
            else:
                out += [f"{pad}$$"] + [f"{pad}{b}" if b else "" for b in body] + [f"{pad}$$"]
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def _target(obj: griffe.Object, name: str) -> str | None:
    """The path that ``name`` names in the scope of ``obj``, or None."""
    first, _, rest = name.partition(".")
    try:
        path = obj.resolve(first)
    except griffe.NameResolutionError:
        return name if rest else None  # dotted: taken as a full path
    return f"{path}.{rest}" if rest else path


def convert(text: str, obj: griffe.Object | None = None) -> str:
    """One docstring's reST markup as Markdown (``obj``: the scope of its references)."""
    text = _blocks(text)
    text = _MATH.sub(lambda m: f"${m[1].strip()}$", text)

    def role(match: re.Match[str]) -> str:
        short, name = match[2] == "~", match[3].strip()
        title = name.rsplit(".", 1)[-1] if short else name
        path = _target(obj, name) if obj is not None else None
        if path is None:
            return f"`{title}`"
        return (
            f'<code><autoref identifier="{html.escape(path)}" optional>'
            f"{html.escape(title)}</autoref></code>"
        )

    return _ROLE.sub(role, text)


def _runtime_docstring(obj: griffe.Object, like: griffe.Docstring | None) -> None:
    """A class whose docstring is built by an expression (``__doc__ = (... + ...)``, to share
    a section between classes) has none statically: take the one Python builds."""
    if obj.docstring is None and obj.is_class and "__doc__" in obj.members:
        doc = griffe.dynamic_import(obj.path).__doc__
        if doc:
            obj.docstring = griffe.Docstring(
                inspect.cleandoc(doc),
                parent=obj,
                parser=like.parser if like else None,
                parser_options=like.parser_options if like else None,
            )


def _walk(obj: griffe.Object, like: griffe.Docstring | None) -> None:
    _runtime_docstring(obj, like)
    if obj.docstring is not None:
        obj.docstring.value = convert(obj.docstring.value, obj)
    for member in obj.members.values():
        if not member.is_alias:
            _walk(member, like)  # type: ignore[arg-type]


class RstMarkup(griffe.Extension):
    """Rewrites the reST markup of every docstring of a loaded package as Markdown."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        _walk(pkg, pkg.docstring)
