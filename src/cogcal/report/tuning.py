"""The tuning part of the report, from ``tuning.csv`` (:mod:`cogcal.runs.columns`).

One tuning group trains the points of a log-spaced grid (λ_f, and the ratio λ_c/λ_f for
COG methods), extends the grid outward while its choice lies on an edge, and picks the
point with the lowest validation NLL (docs/method.md §1). A choice still on an edge when
the extensions stop (``at_edge``; ``cap_reached`` when the cap stopped them) may hold its
methods back: the report notes it under the tables it affects and lists it in the tuning
section, which shows every trained point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from cogcal.report._common import method_order, slug
from cogcal.report.blocks import Paragraph, Section, Table, Text, num, plain
from cogcal.report.frame import protocol_order
from cogcal.report.tables import cell


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
        point = f"lr {plain(self.lr)}" + (f", ratio {plain(self.ratio)}" if self.ratio else "")
        why = ", cap reached" if self.cap_reached else ", the grid could not extend further"
        return (
            f"{self.protocol}/{self.dataset} {self.group} (used by {', '.join(self.used_by)}): "
            f"{point} on the {self.edges or 'grid'} edge after {self.extensions} extension(s){why}"
        )


def _groups(tuning: pd.DataFrame) -> list[tuple[tuple[str, str, str], pd.DataFrame, Any]]:
    """``(key, rows, chosen row or None)`` of every group, in report order."""
    order = {p: i for i, p in enumerate(protocol_order(set(tuning["protocol"])))}
    out = []
    for key, grp in tuning.groupby(["protocol", "dataset", "group"], sort=False):
        chosen = grp[grp["chosen"]]
        out.append((tuple(map(str, key)), grp, chosen.iloc[0] if not chosen.empty else None))
    return sorted(out, key=lambda kg: (order[kg[0][0]], kg[0][1], kg[0][2]))


def _used_by(grp: pd.DataFrame, group: str) -> tuple[str, ...]:
    return tuple(method_order(" ".join(grp["used_by"].astype(str)).split() or [group]))


def edge_choices(tuning: pd.DataFrame | None) -> list[EdgeChoice]:
    """Every tuning group whose final choice is on a grid edge (``at_edge``)."""
    if tuning is None or tuning.empty:
        return []
    out = []
    for (p, ds, g), grp, chosen in _groups(tuning):
        if not grp["at_edge"].any():
            continue
        row = chosen if chosen is not None else grp.iloc[0]
        ratio = float(row["ratio"]) if pd.notna(row["ratio"]) else None
        extensions, cap = int(grp["extensions"].max()), bool(grp["cap_reached"].any())
        used, lr, edges = _used_by(grp, g), float(row["lr"]), str(row["edges"])
        out.append(EdgeChoice(p, ds, g, used, lr, ratio, edges, extensions, cap))
    return out


def grid_key(protocol: str, dataset: str) -> str:
    """The anchor of :func:`grid_table`."""
    return f"tuning-{slug(protocol)}-{slug(dataset)}"


def chosen_table(tuning: pd.DataFrame) -> Table:
    """The chosen point of every group (Tab. 8 analogue), with its edge status."""
    body = []
    for (p, ds, g), grp, row in _groups(tuning):
        at = bool(grp["at_edge"].any())
        edge = (str(grp["edges"].iloc[0]) or "yes") if at else "no"
        edge += " (cap reached)" if at and grp["cap_reached"].any() else ""
        picked = (
            [plain(row[c]) for c in ("lr", "ratio", "calibrator_lr")]
            if row is not None
            else ["none (every point diverged)", "—", "—"]
        )
        body.append(
            [cell(p), cell(ds), cell(g), cell(", ".join(_used_by(grp, g))), *map(cell, picked)]
            + [cell(num(row["val_nll"]) if row is not None else "—"), cell(len(grp))]
            + [cell(int(grp["extensions"].max())), cell(edge, bold=at)]
        )
    header = ["Protocol", "Dataset", "Tuned as", "Used by", "λ_f (lr)", "Ratio λ_c/λ_f", "λ_c"]
    notes: list[Text] = [
        "Chosen by the lowest validation NLL (cross-entropy) of the kept checkpoint; post-hoc "
        "methods by the network before calibration; diverged points count as +inf. The test "
        "split plays no part. 'At edge' (bold) names the edges a choice still lies on after "
        "the grid extensions."
    ]
    header += ["Val NLL", "Points", "Extensions", "At edge"]
    return Table("Selected learning rates (Tab. 8 analogue)", header, body, notes, "tuning-chosen")


def grid_table(tuning: pd.DataFrame, protocol: str, dataset: str) -> Table | None:
    """Every trained point of every group of ``protocol``/``dataset``."""
    d = tuning[(tuning["protocol"] == protocol) & (tuning["dataset"] == dataset)]
    if d.empty:
        return None
    body = []
    for (_, _, g), grp, _ in _groups(d):
        for _, r in grp.sort_values(["lr", "ratio"], na_position="first").iterrows():
            body.append(
                [cell(g)] + [cell(plain(r[c])) for c in ("lr", "ratio", "calibrator_lr")]
                + [cell(num(r["val_nll"]), bold=bool(r["chosen"]))]
                + [cell(num(r[c])) for c in ("val_brier", "val_acc")]
                + [cell(r["status"], bold=r["status"] != "complete")]
                + [cell("chosen" if r["chosen"] else "", bold=bool(r["chosen"]))]
            )  # fmt: skip
    header = ["Group", "λ_f (lr)", "Ratio", "λ_c", "Val NLL", "Val Brier", "Val acc", "Status"]
    notes: list[Text] = [
        "Every trained grid point, including the extensions; a diverged point has no "
        "validation NLL and is never chosen."
    ]
    notes += [f"Grid edge: {e.text()}." for e in edge_choices(d)]
    title = f"Tuning points — {dataset}, {protocol} protocol"
    return Table(title, [*header, "Chosen"], body, notes, grid_key(protocol, dataset))


def tuning_section(tuning: pd.DataFrame | None) -> Section | None:
    """The chosen points, the choices at a grid edge (a table), every trained point."""
    if tuning is None:
        return None
    sec = Section("Tuning: selected learning rates and grid edges", key="tuning")
    if tuning.empty:
        sec.blocks.append(Paragraph("tuning.csv holds no trained point."))
        return sec
    edges = edge_choices(tuning)
    if edges:
        body = [
            [*map(cell, (e.protocol, e.dataset, e.group, ", ".join(e.used_by), plain(e.lr)))]
            + [cell(plain(e.ratio)), cell(e.edges or "grid", bold=True), cell(e.extensions)]
            + [cell(plain(e.cap_reached))]
            for e in edges
        ]
        header = ["Protocol", "Dataset", "Tuned as", "Used by", "λ_f (lr)", "Ratio", "Edge"]
        notes: list[Text] = [
            "Choices still on a grid edge after the extensions: the methods using them may do "
            "better with a wider grid; the ratio's upper edge below 1 is a bound of the method."
        ]
        header += ["Extensions", "Cap reached"]
        title = f"{len(edges)} tuned choice(s) on a grid edge"
        sec.blocks.append(Table(title, header, body, notes, "tuning-edges"))
    else:
        sec.blocks.append(Paragraph("Every tuned choice is interior to its grid."))
    sec.blocks.append(chosen_table(tuning))
    for p in protocol_order(set(tuning["protocol"])):
        for ds in sorted(set(tuning.loc[tuning["protocol"] == p, "dataset"])):
            sec.blocks += [t for t in [grid_table(tuning, p, ds)] if t is not None]
    return sec
