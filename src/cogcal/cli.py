"""The ``cogcal`` command line: thin; it parses, validates and calls the layers below.

User errors (bad flags, unknown names, missing files) print one line ``cogcal: error: ...``
and exit with status 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import cogcal

__all__ = ["main", "build_parser", "UserError"]


class UserError(Exception):
    """An error caused by the user's input; reported as one line, without a traceback."""


#: Subcommand registrars: each adds its parser and sets ``func`` (layers register here).
_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (all subcommands)."""
    parser = argparse.ArgumentParser(
        prog="cogcal",
        description=(
            "Calibration in One Go: train classifiers that are accurate and calibrated in one "
            "run, and compare them with the paper's baselines."
        ),
    )
    parser.add_argument("--version", action="version", version=f"cogcal {cogcal.__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show full tracebacks for errors (for bug reports)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _SUBCOMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 success, 2 user error, 1 failure)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (UserError, ValueError, FileNotFoundError) as err:
        if args.debug:
            raise
        print(f"cogcal: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cogcal: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
