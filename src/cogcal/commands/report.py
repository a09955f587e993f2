"""``cogcal report``: write the report of a bench, run or calibration folder."""

from __future__ import annotations

import argparse
from pathlib import Path

import cogcal.report
from cogcal._errors import ArgumentError
from cogcal.commands._common import UserError
from cogcal.runs.layout import lock_folder

__all__ = ["build", "run"]


def build(directory: Path) -> Path:
    """Build the report of ``directory`` holding its lock (nothing writes it meanwhile);
    returns the path of ``report.html``. A folder the report refuses is the user's input
    (:class:`~cogcal.commands._common.UserError`)."""
    with lock_folder(directory, what=f"folder {directory}", create=False):  # before reading
        try:
            return cogcal.report.build_any(directory)
        except ArgumentError:
            raise
        except ValueError as err:  # build_any's documented refusal of the folder: user input
            raise UserError(str(err)) from err


def run(args: argparse.Namespace) -> int:
    """``cogcal report DIRECTORY``."""
    directory = Path(args.directory)
    html = build(directory)
    print(f"wrote {directory}/report.md and {html}")
    return 0
