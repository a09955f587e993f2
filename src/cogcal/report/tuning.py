"""The tuning part of the report, from ``tuning.csv`` (:mod:`cogcal.report.schema`).

One tuning group trains the points of a log-spaced grid (λ_f, and the ratio λ_c/λ_f for
COG methods), extends the grid outward while its choice lies on an edge, and picks the
point with the lowest validation NLL (docs/method.md §1). A choice still on an edge when
the extensions stop (``at_edge``; ``cap_reached`` when the cap stopped them) may hold its
methods back: the report lists every such choice under the tables it affects
(:func:`edge_notes`) and in the tuning section, which shows every trained point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from cogcal.report._common import method_order, slug
from cogcal.report.blocks import Link, Paragraph, Section, Table, Text
from cogcal.report.frame import protocol_order
from cogcal.report.tables import cell as _cell

__all__ = [
    "EdgeChoice",
    "chosen_table",
    "edge_choices",
    "edge_notes",
    "grid_table",
    "tuning_section",
]


def _g(x: Any) -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:g}"


def _nll(x: Any) -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.4f}"


@dataclass(frozen=True)
class EdgeChoice:
    """A tuning group whose chosen point is still on an edge of its grid."""

    protocol: str
    dataset: str
    group: str
    used_by: tuple[str, ...]
    lr: float
    ratio: float | None
    edges: str
    extensions: int
    cap_reached: bool

    def text(self) -> str:
        """One clause describing the choice.

        >>> EdgeChoice("fair", "d", "ce", ("ce", "ts"), 0.01, None, "lr high", 2, True).text()
        'fair/d ce (used by ce, ts): lr 0.01 on the lr high edge after 2 extension(s), cap reached'
        """
        point = f"lr {_g(self.lr)}" + (f", ratio {_g(self.ratio)}" if self.ratio else "")
        why = ", cap reached" if self.cap_reached else ", the grid could not extend further"
        return (
            f"{self.protocol}/{self.dataset} {self.group} (used by {', '.join(self.used_by)}): "
            f"{point} on the {self.edges or 'grid'} edge after {self.extensions} "
            f"extension(s){why}"
        )


def _groups(tuning: pd.DataFrame) -> list[tuple[tuple[str, str, str], pd.DataFrame]]:
    out = []
    for key, grp in tuning.groupby(["protocol", "dataset", "group"], sort=False):
        out.append((tuple(map(str, key)), grp))
    order = {p: i for i, p in enumerate(protocol_order(set(tuning["protocol"])))}
    return sorted(out, key=lambda kg: (order[kg[0][0]], kg[0][1], kg[0][2]))


def _used_by(grp: pd.DataFrame, group: str) -> tuple[str, ...]:
    names = " ".join(grp["used_by"].astype(str)).split()
    return tuple(method_order(names or [group]))


def edge_choices(tuning: pd.DataFrame | None) -> list[EdgeChoice]:
    """Every tuning group whose final choice is on a grid edge (``at_edge``)."""
    if tuning is None or tuning.empty:
        return []
    out = []
    for (protocol, dataset, group), grp in _groups(tuning):
        if not grp["at_edge"].any():
            continue
        chosen = grp[grp["chosen"]]
        row = (chosen if not chosen.empty else grp).iloc[0]
        ratio = row["ratio"]
        out.append(
            EdgeChoice(
                protocol,
                dataset,
                group,
                _used_by(grp, group),
                float(row["lr"]),
                float(ratio) if pd.notna(ratio) else None,
                str(row["edges"]),
                int(grp["extensions"].max()),
                bool(grp["cap_reached"].any()),
            )
        )
    return out


def edge_notes(
    tuning: pd.DataFrame | None, protocol: str, dataset: str, methods: list[str] | None = None
) -> list[Text]:
    """Notes for a table of ``protocol``/``dataset`` (showing ``methods``): one per tuned
    choice at a grid edge that a shown method uses, linking to the tuning section."""
    notes: list[Text] = []
    shown = set(methods) if methods is not None else None
    for e in edge_choices(tuning):
        if e.protocol != protocol or e.dataset != dataset:
            continue
        if shown is not None and not shown & set(e.used_by):
            continue
        notes.append(
            [
                f"Grid edge: {e.text()}; these methods may do better with a wider grid (",
                Link("tuning points", grid_key(protocol, dataset)),
                ").",
            ]
        )
    return notes


def grid_key(protocol: str, dataset: str) -> str:
    """The anchor of :func:`grid_table`."""
    return f"tuning-{slug(protocol)}-{slug(dataset)}"


def chosen_table(tuning: pd.DataFrame) -> Table | None:
    """The chosen point of every group (Tab. 8 analogue), with its edge status."""
    if tuning is None or tuning.empty:
        return None
    rows = []
    for (protocol, dataset, group), grp in _groups(tuning):
        chosen = grp[grp["chosen"]]
        row = chosen.iloc[0] if not chosen.empty else None
        at = bool(grp["at_edge"].any())
        edge = "no"
        if at:
            edge = str(grp["edges"].iloc[0]) or "yes"
            if grp["cap_reached"].any():
                edge += " (cap reached)"
        rows.append(
            [
                _cell(protocol),
                _cell(dataset),
                _cell(group),
                _cell(", ".join(_used_by(grp, group))),
                _cell(_g(row["lr"]) if row is not None else "none (every point diverged)"),
                _cell(_g(row["ratio"]) if row is not None else "—"),
                _cell(_g(row["calibrator_lr"]) if row is not None else "—"),
                _cell(_nll(row["val_nll"]) if row is not None else "—"),
                _cell(len(grp)),
                _cell(int(grp["extensions"].max())),
                _cell(edge, bold=at),
            ]
        )
    header = [
        "Protocol",
        "Dataset",
        "Tuned as",
        "Used by",
        "λ_f (lr)",
        "Ratio λ_c/λ_f",
        "λ_c",
        "Val NLL",
        "Points",
        "Extensions",
        "At edge",
    ]
    notes: list[Text] = [
        "Chosen by the lowest validation NLL (cross-entropy) of the kept checkpoint; post-hoc "
        "methods by the network before calibration; diverged points count as +inf. The test "
        "split plays no part. 'At edge' (bold) names the edges a choice still lies on after "
        "the grid extensions."
    ]
    return Table("Selected learning rates (Tab. 8 analogue)", header, rows, notes, "tuning-chosen")


def grid_table(tuning: pd.DataFrame, protocol: str, dataset: str) -> Table | None:
    """Every trained point of every group of ``protocol``/``dataset``."""
    d = tuning[(tuning["protocol"] == protocol) & (tuning["dataset"] == dataset)]
    if d.empty:
        return None
    rows = []
    for (_, _, group), grp in _groups(d):
        grp = grp.sort_values(["lr", "ratio"], na_position="first")
        for _, r in grp.iterrows():
            rows.append(
                [
                    _cell(group),
                    _cell(_g(r["lr"])),
                    _cell(_g(r["ratio"])),
                    _cell(_g(r["calibrator_lr"])),
                    _cell(_nll(r["val_nll"]), bold=bool(r["chosen"])),
                    _cell(_nll(r["val_brier"])),
                    _cell(_nll(r["val_acc"])),
                    _cell(r["status"], bold=r["status"] != "complete"),
                    _cell("chosen" if r["chosen"] else "", bold=bool(r["chosen"])),
                ]
            )
    header = ["Group", "λ_f (lr)", "Ratio", "λ_c", "Val NLL", "Val Brier", "Val acc", "Status"]
    header.append("Chosen")
    notes: list[Text] = [
        "Every trained grid point, including the extensions; a diverged point has no "
        "validation NLL and is never chosen."
    ]
    notes += [f"Grid edge: {e.text()}." for e in edge_choices(d)]
    return Table(
        f"Tuning points — {dataset}, {protocol} protocol",
        header,
        rows,
        notes,
        grid_key(protocol, dataset),
    )


def tuning_section(tuning: pd.DataFrame | None) -> Section | None:
    """The tuning section: the chosen points, the edge choices, every trained point."""
    if tuning is None:
        return None
    sec = Section("Tuning: selected learning rates and grid edges", key="tuning")
    if tuning.empty:
        sec.blocks.append(Paragraph("tuning.csv holds no trained point."))
        return sec
    edges = edge_choices(tuning)
    if edges:
        body = [
            [_cell(e.protocol), _cell(e.dataset), _cell(e.group), _cell(", ".join(e.used_by))]
            + [_cell(_g(e.lr)), _cell(_g(e.ratio)), _cell(e.edges or "grid", bold=True)]
            + [_cell(e.extensions), _cell("yes" if e.cap_reached else "no")]
            for e in edges
        ]
        header = ["Protocol", "Dataset", "Tuned as", "Used by", "λ_f (lr)", "Ratio", "Edge"]
        notes: list[Text] = [
            "Choices still on a grid edge after the extensions: the methods using them may do "
            "better with a wider grid; the ratio's upper edge below 1 is a bound of the method."
        ]
        title = f"{len(edges)} tuned choice(s) on a grid edge"
        sec.blocks.append(
            Table(title, [*header, "Extensions", "Cap reached"], body, notes, "tuning-edges")
        )
    else:
        sec.blocks.append(Paragraph("Every tuned choice is interior to its grid."))
    table = chosen_table(tuning)
    if table is not None:
        sec.blocks.append(table)
    for protocol in protocol_order(set(tuning["protocol"])):
        for dataset in sorted(set(tuning.loc[tuning["protocol"] == protocol, "dataset"])):
            t = grid_table(tuning, protocol, dataset)
            if t is not None:
                sec.blocks.append(t)
    return sec
