"""Render a report (sections of paragraphs, tables and figures) to Markdown and HTML.

``report.html`` is self-contained (inline styles, images embedded as ``data:`` URIs, no
scripts). Text is escaped for its format, so a name such as ``a|b`` or ``my_*net*`` shows
as written; tables and keyed sections carry the anchors :class:`Link` points to.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from cogcal.report.blocks import Cell, Figure, Link, Paragraph, Section, Table, Text

# --------------------------------------------------------------------------- markdown


_MD_ESCAPED = re.compile(r"([\\`*_\[\]<>|#])")


def md_escape(text: str) -> str:
    """``text`` with every Markdown special character escaped, on one line.

    >>> md_escape("a|b_*c*") == r"a\\|b\\_\\*c\\*"
    True
    >>> md_escape("- x")
    '\\\\- x'
    """
    out = _MD_ESCAPED.sub(r"\\\1", str(text).replace("\r", " ").replace("\n", " "))
    if out[:1] in ("-", "+"):
        out = "\\" + out
    return out


def _md_inline(text: Text) -> str:
    parts = [text] if isinstance(text, str) else text
    return "".join(
        f"[{md_escape(p.text)}](#{p.key})" if isinstance(p, Link) else md_escape(p) for p in parts
    )


def _anchor(key: str) -> str:
    return f'<a id="{html.escape(key, quote=True)}"></a>'


def _md_table(t: Table) -> str:
    lines = [_anchor(t.key)] if t.key else []
    lines += [f"**{md_escape(t.title)}**", ""]
    lines.append("| " + " | ".join(md_escape(h) for h in t.header) + " |")
    lines.append("|" + "|".join("---" for _ in t.header) + "|")
    for row in t.rows:
        cells = (
            f"**{md_escape(c.text)}**" if c.bold and c.text else md_escape(c.text) for c in row
        )
        lines.append("| " + " | ".join(cells) + " |")
    for note in t.notes:
        lines += ["", f"*{_md_inline(note)}*"]
    return "\n".join(lines)


def _md_block(block: Paragraph | Table | Figure | Section, level: int) -> str:
    if isinstance(block, Section):
        head = f"{'#' * min(level, 6)} {md_escape(block.title)}"
        parts = [(_anchor(block.key) + "\n\n" + head) if block.key else head]
        parts += [_md_block(b, level + 1) for b in block.blocks]
        return "\n\n".join(parts)
    if isinstance(block, Table):
        return _md_table(block)
    if isinstance(block, Figure):
        cap = md_escape(block.caption)
        return f"![{cap}]({block.path})\n\n*{cap}*"
    items = "\n".join(f"- {_md_inline(i)}" for i in block.items)
    return "\n\n".join(t for t in (_md_inline(block.text) if block.text else "", items) if t)


def render_markdown(title: str, sections: list[Section]) -> str:
    """The report as Markdown (figures linked relative to the report folder)."""
    body = "\n\n".join(_md_block(s, 2) for s in sections)
    return f"# {md_escape(title)}\n\n{body}\n"


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


def _html_inline(text: Text) -> str:
    parts = [text] if isinstance(text, str) else text
    return "".join(
        f'<a href="#{_esc(p.key)}">{_esc(p.text)}</a>' if isinstance(p, Link) else _esc(p)
        for p in parts
    )


_NUMERIC = re.compile(r"^[\s\d.,±\-+−—\[\]/%naeEΔ=]*(\(\d+ of \d+ seeds?\))?$")


def _html_cell(c: Cell) -> str:
    text = f"<b>{_esc(c.text)}</b>" if c.bold and c.text else _esc(c.text)
    cls = "" if _NUMERIC.match(c.text) else ' class="t"'
    return f"<td{cls}>{text}</td>"


def _html_table(t: Table) -> str:
    out = [
        f'<div class="tablewrap"><table id="{_esc(t.key)}">',
        f"<caption>{_esc(t.title)}</caption>",
    ]
    out.append("<thead><tr>" + "".join(f"<th>{_esc(h)}</th>" for h in t.header) + "</tr></thead>")
    out += ["<tbody>", *("<tr>" + "".join(map(_html_cell, row)) + "</tr>" for row in t.rows)]
    out.append("</tbody></table></div>")
    out += [f'<p class="note">{_html_inline(n)}</p>' for n in t.notes]
    return "\n".join(out)


def _data_uri(path: Path) -> str:
    mime = "image/svg+xml" if path.suffix.lower() == ".svg" else "image/png"
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
        parts.append(f"<p>{_html_inline(block.text)}</p>")
    if block.items:
        parts.append("<ul>" + "".join(f"<li>{_html_inline(i)}</li>" for i in block.items) + "</ul>")
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
