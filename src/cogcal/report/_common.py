"""Small helpers shared by the report sections."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

__all__ = ["check_results_frame", "is_cog"]


def is_cog(method: str) -> bool:
    """Whether ``method`` is a COG variant (the methods registry; by name as a fallback)."""
    from cogcal.train.methods import METHODS

    spec = METHODS.get(method)
    return spec.is_cog if spec is not None else method.startswith("cog-")


def check_results_frame(df: pd.DataFrame, required: Sequence[str]) -> None:
    """Raise ``ValueError`` unless ``df`` is a results.csv table with ``required`` columns."""
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"expected the tidy results.csv DataFrame, got {type(df).__name__}.")
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(
            f"the results table lacks the column(s) {missing}; pass the tidy results.csv "
            f"table (columns {list(required)} at least; SPEC §6)."
        )
