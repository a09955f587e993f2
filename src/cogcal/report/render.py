"""Render a report (sections of paragraphs, tables and figures) to Markdown and HTML.

``report.md`` links the figures under ``figures/``; ``report.html`` is self-contained:
styles inline and every image embedded as a base64 ``data:`` URI, so it opens offline
and can be mailed as one file. No scripts, no external resources.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

from cogcal.report.tables import Cell, Table

__all__ = ["Figure", "Paragraph", "Section", "render_html", "render_markdown"]


@dataclass
class Paragraph:
    """A paragraph of plain text (``items`` makes it a bullet list)."""

    text: str = ""
    items: list[str] = field(default_factory=list)


@dataclass
class Figure:
    """An image file (PNG) with a caption; ``path`` is relative to the report folder."""

    path: str
    caption: str


@dataclass
class Section:
    """A titled section holding paragraphs, tables, figures and subsections."""

    title: str
    blocks: list[Paragraph | Table | Figure | Section] = field(default_factory=list)
    key: str = ""


# --------------------------------------------------------------------------- markdown


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(t: Table) -> str:
    lines = [f"**{t.title}**", ""]
    lines.append("| " + " | ".join(_md_escape(h) for h in t.header) + " |")
    lines.append("|" + "|".join("---" for _ in t.header) + "|")
    for row in t.rows:
        cells = [
            (f"**{_md_escape(c.text)}**" if c.bold and c.text else _md_escape(c.text)) for c in row
        ]
        lines.append("| " + " | ".join(cells) + " |")
    for note in t.notes:
        lines += ["", f"*{note}*"]
    return "\n".join(lines)


def _md_block(block: Paragraph | Table | Figure | Section, level: int) -> str:
    if isinstance(block, Section):
        parts = [f"{'#' * level} {block.title}"]
        parts += [_md_block(b, level + 1) for b in block.blocks]
        return "\n\n".join(parts)
    if isinstance(block, Table):
        return _md_table(block)
    if isinstance(block, Figure):
        return f"![{block.caption}]({block.path})\n\n*{block.caption}*"
    text = block.text
    if block.items:
        text = (text + "\n\n" if text else "") + "\n".join(f"- {i}" for i in block.items)
    return text


def render_markdown(title: str, sections: list[Section]) -> str:
    """The report as Markdown (figures linked relative to the report folder)."""
    body = "\n\n".join(_md_block(s, 2) for s in sections)
    return f"# {title}\n\n{body}\n"


# --------------------------------------------------------------------------- html

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;
max-width:1200px;padding:0 1em;color:#1a1a1a;line-height:1.45}
h1{border-bottom:2px solid #333}h2{border-bottom:1px solid #bbb;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0 .3em;font-size:.88em}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:right;white-space:nowrap}
th{background:#f0f0f0}td.t{text-align:left;white-space:normal}td:first-child,th:first-child{text-align:left}
caption{caption-side:top;text-align:left;font-weight:600;padding:.3em 0}
tr:nth-child(even) td{background:#fafafa}
.note{font-size:.85em;color:#444;margin:.2em 0 1.2em}
figure{margin:1em 0;display:inline-block;vertical-align:top}
figure img{max-width:100%;border:1px solid #ddd}
figcaption{font-size:.85em;color:#444}
nav ul{columns:2;font-size:.9em}
.tablewrap{overflow-x:auto}
"""


def _esc(text: str) -> str:
    return html.escape(str(text), quote=True)


_NUMERIC = re.compile(r"^[\s\d.,±\-+−—\[\]/%naeE]*$")


def _html_cell(c: Cell) -> str:
    text = _esc(c.text)
    if c.bold and c.text:
        text = f"<b>{text}</b>"
    cls = "" if _NUMERIC.match(c.text) else ' class="t"'
    return f"<td{cls}>{text}</td>"


def _html_table(t: Table) -> str:
    out = [
        f'<div class="tablewrap"><table id="{_esc(t.key)}">',
        f"<caption>{_esc(t.title)}</caption>",
    ]
    out.append("<thead><tr>" + "".join(f"<th>{_esc(h)}</th>" for h in t.header) + "</tr></thead>")
    out.append("<tbody>")
    for row in t.rows:
        cells = "".join(_html_cell(c) for c in row)
        out.append(f"<tr>{cells}</tr>")
    out.append("</tbody></table></div>")
    out += [f'<p class="note">{_esc(n)}</p>' for n in t.notes]
    return "\n".join(out)


def _data_uri(path: Path) -> str:
    suffix = path.suffix.lower()
    mime = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg"}.get(
        suffix, "application/octet-stream"
    )
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def _html_block(block: Paragraph | Table | Figure | Section, level: int, root: Path) -> str:
    if isinstance(block, Section):
        anchor = f' id="{_esc(block.key)}"' if block.key else ""
        parts = [f"<h{level}{anchor}>{_esc(block.title)}</h{level}>"]
        parts += [_html_block(b, min(level + 1, 6), root) for b in block.blocks]
        return "\n".join(parts)
    if isinstance(block, Table):
        return _html_table(block)
    if isinstance(block, Figure):
        path = root / block.path
        if not path.is_file():
            return f'<p class="note">(figure missing: {_esc(block.path)})</p>'
        return (
            f'<figure><img src="{_data_uri(path)}" alt="{_esc(block.caption)}">'
            f"<figcaption>{_esc(block.caption)}</figcaption></figure>"
        )
    parts = []
    if block.text:
        parts.append(f"<p>{_esc(block.text)}</p>")
    if block.items:
        parts.append("<ul>" + "".join(f"<li>{_esc(i)}</li>" for i in block.items) + "</ul>")
    return "\n".join(parts)


def render_html(title: str, sections: list[Section], root: Path) -> str:
    """The report as one self-contained HTML page (images embedded from ``root``)."""
    toc = "".join(
        f'<li><a href="#{_esc(s.key)}">{_esc(s.title)}</a></li>' for s in sections if s.key
    )
    body = "\n".join(_html_block(s, 2, Path(root)) for s in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head>\n<body>\n"
        f"<h1>{_esc(title)}</h1>\n<nav><ul>{toc}</ul></nav>\n{body}\n</body></html>\n"
    )
