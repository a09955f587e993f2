"""The ``cogcal`` command (``python -m cogcal`` too): SIGINT and SIGTERM are honoured from
the first moment.

Importing the command line takes a second or two (torch). The handlers are installed before
anything heavy is imported (``import cogcal`` imports nothing heavy; :mod:`cogcal._errors`
only :mod:`signal`), so a signal while Python is still importing ends the command as one
during a command does: the one line ``cogcal: interrupted (SIGINT)`` (or ``SIGTERM``) and the
exit status 128 + the signal's number (130, 143; docs/cli.md), never a traceback or a silent
death. Once :mod:`cogcal.cli` is imported SIGINT raises ``KeyboardInterrupt`` again and
:func:`cogcal.cli.main` handles both signals while a command runs.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Sequence

from cogcal._errors import QUIET_EXIT, Interrupted, other_rank

__all__ = ["main"]


def _end_while_importing(signum: int, frame: object) -> None:
    """A signal while the command line is imported ends the process here, with the line and
    status of an interrupted command (a process other than rank 0: quietly). An exception
    raised here would unwind through whatever is importing, and torch's imports run Python
    code from C++ (pybind11), where it ends in ``std::terminate``: SIGABRT and a C++ trace
    instead of the line (seen with Ctrl-C 0.5 s after a two-process run's second process
    started). Nothing has been written yet: there is nothing to clean up."""
    if not other_rank():
        print(f"cogcal: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        sys.stderr.flush()
        os._exit(128 + signum)
    os._exit(QUIET_EXIT + signum)


def _raise(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Install the handlers, import the command line and run it; returns the exit status."""
    with_handlers = True
    signals = (signal.SIGINT, signal.SIGTERM)
    try:
        previous = {s: signal.signal(s, _end_while_importing) for s in signals}
    except ValueError:  # not the main thread (an embedding program): leave signals alone
        with_handlers = False
    try:
        # imported here, not at the top: the handlers above must be in place first
        cli = importlib.import_module("cogcal.cli")
        if with_handlers:  # Ctrl-C raises KeyboardInterrupt again (cli.main handles it)
            signal.signal(signal.SIGINT, previous[signal.SIGINT])
            signal.signal(signal.SIGTERM, _raise)
        return int(cli.main(argv))
    except (KeyboardInterrupt, Interrupted) as err:  # before or after cli.main's own handling
        signum = err.signum if isinstance(err, Interrupted) else int(signal.SIGINT)
        if other_rank():  # a process of a multi-process run: rank 0 prints the line
            return QUIET_EXIT + signum
        print(f"cogcal: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + signum


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
