"""The checkpoint files of a run folder (``checkpoints/last.ckpt``, ``best.ckpt``): their
format, and how any of them is read safely.

What a checkpoint holds and when it is written is the trainer's
(:mod:`cogcal.train.checkpoints`); every checkpoint carries the format :data:`CHECKPOINT_FORMAT`
and, under ``"config_sha256"``, the digest of the configuration it was trained with
(:func:`cogcal.runs.config_digest`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from cogcal._errors import ArgumentError

__all__ = ["CHECKPOINT_FORMAT", "CheckpointError", "load_checkpoint"]

CHECKPOINT_FORMAT = "cogcal-checkpoint/2"


class CheckpointError(ArgumentError):
    """A checkpoint is missing, empty, truncated or not a cogcal checkpoint (a run folder
    the user pointed at that cannot be used: a user error, exit 2 on the command line)."""


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a cogcal checkpoint safely (``torch.load(weights_only=True)``).

    Raises
    ------
    CheckpointError
        Missing, empty (0 bytes), truncated or foreign files, each named with the fix.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist.") from None
    if size == 0:
        raise CheckpointError(
            f"checkpoint {path} is empty (0 bytes): the run was interrupted while saving; "
            "delete it and resume (an earlier checkpoint is used), or start over."
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises many types for a bad file
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt ({type(err).__name__}: {detail}); "
            "delete it and resume, or start over."
        ) from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path} is not a checkpoint of this cogcal version (format "
            f"{ckpt.get('format') if isinstance(ckpt, dict) else type(ckpt).__name__!r}, "
            f"expected {CHECKPOINT_FORMAT!r}); start the run over."
        )
    return ckpt
