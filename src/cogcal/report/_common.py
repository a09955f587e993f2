"""The methods registry as the report sees it, and small shared helpers.

A results table may name methods the registry does not know (a plugin): they count as
non-COG and have no counterpart.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cogcal import _io
from cogcal.runs.methods import COG_PAIRS, METHODS
from cogcal.runs.methods import is_cog as _registry_is_cog


def is_cog(method: str) -> bool:
    """Whether ``method`` is a registered COG variant (unknown names are not).

    >>> is_cog("cog-ms"), is_cog("ts"), is_cog("my|method")
    (True, False, False)
    """
    return method in METHODS and _registry_is_cog(method)


def counterparts() -> dict[str, str]:
    """COG variant -> the method it is compared with: ``COG_PAIRS`` of the registry, and
    for a COG variant it does not list, the non-COG method with the same loss whose
    post-hoc or second-stage calibrator is the variant's (none for ``fc``).

    >>> counterparts()["cog-ts"], counterparts()["cog-ls"]
    ('ts', 'ls')
    """
    pairs = dict(COG_PAIRS)
    for name, m in METHODS.items():
        kind = None if m.cog == "fc" else m.cog
        same = [o for o, x in METHODS.items() if not x.is_cog and x.loss == m.loss]
        match = [o for o in same if (METHODS[o].posthoc or METHODS[o].stage2) == kind]
        if m.is_cog and name not in pairs and match:
            pairs[name] = match[0]
    return pairs


def method_order(methods: Sequence[str]) -> list[str]:
    """``methods`` in registry order, unknown names last (sorted), each once."""
    present = list(dict.fromkeys(map(str, methods)))
    known = [m for m in METHODS if m in present]
    return known + sorted(m for m in present if m not in METHODS)


def slug(text: str) -> str:
    """A file- and anchor-safe form of ``text``.

    >>> slug("cifar10|x y"), slug("mnist1d")
    ('cifar10-x-y', 'mnist1d')
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-") or "x"


def sev_key(severity: Any) -> tuple[float, str]:
    """Sort key of a shift severity: numerically, non-numbers last."""
    try:
        return float(severity), str(severity)
    except ValueError:
        return math.inf, str(severity)


def save_figure(fig: Any, path: str | Path, dpi: int = 100) -> Path:
    """Write a matplotlib figure atomically, in the format its suffix names."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ValueError(
            f"cannot tell the image format of {str(path)!r}: use a file name ending in .png, "
            ".svg or .pdf."
        )
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lower()[1:], dpi=dpi)
    return _io.write_bytes(path, buf.getvalue())
