"""User-input errors that speak in Python arguments in Python and in flags on the CLI.

A library call that gets bad input raises :class:`ArgumentError` (a ``ValueError``) whose
``str()`` names the Python argument (``root=...``, ``lr``); the command line prints
:attr:`ArgumentError.cli_message` instead, which names the flag (``--data-root``, ``--lr``).

>>> err = ArgumentError("`lr` must be positive, got 0.", cli_message="--lr must be positive, got 0.")
>>> str(err), err.cli_message
('`lr` must be positive, got 0.', '--lr must be positive, got 0.')
>>> isinstance(err, ValueError)
True
"""

from __future__ import annotations

import os
import signal

__all__ = ["QUIET_EXIT", "ArgumentError", "Interrupted", "cli_message", "other_rank"]

#: The exit status ``QUIET_EXIT + n`` of a process other than rank 0 of a multi-process run
#: that signal ``n`` ended without a word: the main process prints the one line
#: (:mod:`cogcal.train.devices`).
QUIET_EXIT = 192


def other_rank() -> bool:
    """Whether this process is one of a multi-process run other than rank 0 (``RANK`` or
    ``LOCAL_RANK`` not 0, as Lightning sets them for the processes it starts): interrupted,
    it ends without a word (:data:`QUIET_EXIT`), and rank 0 prints the one line."""
    return any(os.environ.get(name, "0") not in ("", "0") for name in ("LOCAL_RANK", "RANK"))


class ArgumentError(ValueError):
    """Bad user input: ``str(err)`` names Python arguments, ``cli_message`` names flags.

    Parameters
    ----------
    message : str
        The message for Python callers (names arguments, e.g. ``root=``).
    cli_message : str, optional
        The same message for the command line (names flags, e.g. ``--data-root``);
        defaults to ``message``.
    """

    def __init__(self, message: str, *, cli_message: str | None = None) -> None:
        super().__init__(message)
        self.cli_message = cli_message if cli_message is not None else message


def cli_message(err: BaseException) -> str:
    """The command-line form of ``err``: its ``cli_message`` if it has one, else ``str(err)``."""
    text = getattr(err, "cli_message", None)
    return text if isinstance(text, str) else str(err)


class Interrupted(BaseException):
    """The process received SIGTERM (or SIGINT): stop, keep what was saved, exit 128 + signal.

    A ``BaseException`` like ``KeyboardInterrupt``, so that ``except Exception`` blocks
    cannot swallow it and report success.
    """

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.signame = signal.Signals(self.signum).name
        super().__init__(f"interrupted ({self.signame})")
