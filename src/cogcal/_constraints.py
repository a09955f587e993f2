"""Constraints on user-facing values, each rule declared once (as scikit-learn's
``_parameter_constraints``).

A constraint (:class:`Integer`, :class:`Real`, :class:`Options`, :class:`Boolean`,
:class:`Grid`) says what a value must be; :func:`check` applies it and raises one
:class:`NamedError` (an :class:`~cogcal._errors.ArgumentError`) built by one template,
which names the Python argument in Python and the flag on the command line::

    <who> must be <what the constraint allows>, got <the value>.

The rules the library, the command line and the suites share are declared here once
(:data:`SEED`, :data:`COUNT`, :data:`CV_FOLDS`, ...); each command-line flag takes its
value through the same rule (:func:`check` with ``flag=``; :func:`parse_numbers` reads a
comma-separated grid), so a flag and its Python argument refuse the same values with the
same words.

>>> check(3, COUNT, "batch_size", flag="--batch-size")
3
>>> check(0, COUNT, "batch_size", flag="--batch-size")
Traceback (most recent call last):
...
cogcal._constraints.NamedError: `batch_size` must be an integer >= 1, got 0.
>>> check([1e-3, 1e-3], LR_GRID, "lrs", flag="--lrs")
Traceback (most recent call last):
...
cogcal._constraints.NamedError: `lrs` lists 0.001 twice; give each grid value once.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cogcal._errors import ArgumentError

__all__ = [
    "COUNT",
    "CV_FOLDS",
    "Boolean",
    "FRACTION",
    "Constraint",
    "Grid",
    "Integer",
    "LR_GRID",
    "NON_NEGATIVE",
    "NON_NEGATIVE_REAL",
    "NamedError",
    "Options",
    "POSITIVE",
    "Real",
    "SEED",
    "SEED_MAX",
    "check",
    "parse_numbers",
    "python_name",
    "violation",
]

#: The largest seed numpy accepts (``numpy.random.seed``'s range is 0 to 2**32 - 1).
SEED_MAX = 2**32 - 1


class Constraint:
    """What a value must be: :meth:`describe` says it, :meth:`problem` tests it."""

    def describe(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def problem(self, value: Any) -> str | None:
        """``None`` when ``value`` satisfies the constraint, else what is wrong with it
        (the end of a sentence that starts with the argument's name)."""
        raise NotImplementedError  # pragma: no cover - abstract

    def convert(self, value: Any) -> Any:
        """The checked value in its canonical type (``int``, ``float``, a tuple)."""
        return value


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class Integer(Constraint):
    """An integer (not a bool) from ``low`` to ``high``, both included (``None``: no bound).

    ``noun`` names the kind of value (``"an integer"``; ``"a count"``), ``note`` follows
    the range in messages (``"(folds)"``).
    """

    low: int | None = None
    high: int | None = None
    noun: str = "an integer"
    note: str = ""

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            text = f"{self.noun} from {self.low} to {self.high}"
        elif self.low is not None:
            text = f"{self.noun} >= {self.low}"
        elif self.high is not None:
            text = f"{self.noun} <= {self.high}"
        else:
            text = self.noun
        return f"{text} {self.note}" if self.note else text

    def problem(self, value: Any) -> str | None:
        ok = _is_int(value) and (self.low is None or value >= self.low)
        ok = ok and (self.high is None or value <= self.high)
        return None if ok else f"must be {self.describe()}, got {value!r}."

    def convert(self, value: Any) -> int:
        return int(value)


@dataclass(frozen=True)
class Real(Constraint):
    """A finite real number (not a bool) within the bounds; ``closed`` says which bounds
    belong to the interval: ``"both"``, ``"left"``, ``"right"`` or ``"neither"``.
    ``noun`` and ``note`` word messages as :class:`Integer`'s do."""

    low: float | None = None
    high: float | None = None
    closed: str = "both"
    noun: str = "a finite number"
    note: str = ""

    def describe(self) -> str:
        if self.low == 0 and self.high is None and self.closed in ("neither", "right"):
            text = "a positive finite number"
        elif self.low == 0 and self.high is None:
            text = f"{self.noun} >= 0"
        else:
            left = "[" if self.closed in ("both", "left") else "("
            right = "]" if self.closed in ("both", "right") else ")"
            lo = "-inf" if self.low is None else f"{self.low:g}"
            hi = "inf" if self.high is None else f"{self.high:g}"
            noun = "a number" if None not in (self.low, self.high) else self.noun
            text = f"{noun} in {left}{lo}, {hi}{right}"
        return f"{text} {self.note}" if self.note else text

    def problem(self, value: Any) -> str | None:
        if not _is_real(value) or not math.isfinite(value):
            return f"must be {self.describe()}, got {value!r}."
        low_ok = self.low is None or (
            value >= self.low if self.closed in ("both", "left") else value > self.low
        )
        high_ok = self.high is None or (
            value <= self.high if self.closed in ("both", "right") else value < self.high
        )
        return None if low_ok and high_ok else f"must be {self.describe()}, got {value!r}."

    def convert(self, value: Any) -> float:
        return float(value)


@dataclass(frozen=True)
class Options(Constraint):
    """One of ``values`` (compared with ``==``)."""

    values: tuple[Any, ...]

    def describe(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)

    def problem(self, value: Any) -> str | None:
        try:
            ok = any(value == v and type(value) is type(v) for v in self.values)
        except TypeError:
            ok = False
        return None if ok else f"must be {self.describe()}, got {value!r}."


@dataclass(frozen=True)
class Boolean(Constraint):
    """``True`` or ``False`` (not ``0``/``1``, not a string)."""

    def describe(self) -> str:
        return "true or false"

    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, bool) else f"must be {self.describe()}, got {value!r}."


@dataclass(frozen=True)
class Grid(Constraint):
    """A non-empty list of values, each satisfying ``element``, none given twice
    (numbers within a relative 1e-9 count as the same); :meth:`convert` sorts them."""

    element: Constraint = Real(0, None, closed="neither")

    def describe(self) -> str:
        return "a non-empty list of positive numbers"

    def problem(self, value: Any) -> str | None:
        if isinstance(value, str | bytes) or not isinstance(value, Sequence) or not value:
            return f"must be {self.describe()}, got {value!r}."
        seen: list[Any] = []
        for v in value:
            if self.element.problem(v) is not None:
                return f"values must be {_plural(self.element.describe())}, got {v!r}."
            if any(_same(v, u) for u in seen):
                shown = f"{v:g}" if _is_real(v) else repr(v)
                return f"lists {shown} twice; give each grid value once."
            seen.append(v)
        return None

    def convert(self, value: Any) -> tuple[Any, ...]:
        return tuple(sorted(self.element.convert(v) for v in value))


def _same(a: Any, b: Any) -> bool:
    if _is_real(a) and _is_real(b):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return bool(a == b)


def _plural(description: str) -> str:
    """``"a positive finite number"`` -> ``"positive finite numbers"``."""
    for article in ("an ", "a "):
        if description.startswith(article):
            description = description[len(article) :]
            break
    head, _, rest = description.partition(" in ")
    head = head if head.endswith("s") else head + "s"
    return f"{head} in {rest}" if rest else head


# ----------------------------------------------------------------------------- shared rules

#: A count of something: batch size, epochs, jobs, seeds, bootstrap resamples, bins.
COUNT = Integer(1)
#: A number that may be zero: ``max_extensions``, workers, patience.
NON_NEGATIVE = Integer(0)
#: A finite real that may be zero: a weight decay, a penalty strength.
NON_NEGATIVE_REAL = Real(0, None)
#: A positive finite real: a learning rate, a temperature, a time.
POSITIVE = Real(0, None, closed="neither")
#: A share strictly between 0 and 1: a held-out fraction.
FRACTION = Real(0, 1, closed="neither")
#: A random seed (numpy's seeding range).
SEED = Integer(0, SEED_MAX)
#: The folds of a cross-validation (``cv``).
CV_FOLDS = Integer(2, note="(folds)")
#: A grid of learning rates or calibrator-rate ratios: positive, finite, each once.
LR_GRID = Grid()


# ----------------------------------------------------------------------------- checking


def python_name(name: str) -> str:
    """A Python argument in backticks; a dotted key (``tune.seed``) as written."""
    return f"`{name}`" if name.isidentifier() else name


class NamedError(ArgumentError):
    """An error whose message names arguments: ``str(err)`` as Python arguments
    (:func:`python_name`), ``err.cli_message`` as command-line flags (``flag_of``; a name
    without a flag is shown as in Python).

    ``message`` writes the text given a way to name arguments, so one sentence serves
    both surfaces.

    >>> err = NamedError(lambda n: f"{n('lr')} must be positive.", {"lr": "--lr"}.get)
    >>> str(err), err.cli_message
    ('`lr` must be positive.', '--lr must be positive.')
    """

    def __init__(
        self,
        message: Callable[[Callable[[str], str]], str],
        flag_of: Callable[[str], str | None] = lambda name: None,
    ) -> None:
        super().__init__(
            message(python_name),
            cli_message=message(lambda name: flag_of(name) or python_name(name)),
        )


def violation(
    value: Any, constraint: Constraint, name: str, *, flag: str | None = None
) -> NamedError | None:
    """The :class:`NamedError` that :func:`check` would raise, or ``None``."""
    problem = constraint.problem(value)
    if problem is None:
        return None
    return NamedError(lambda n: f"{n(name)} {problem}", {name: flag}.get)


def check(value: Any, constraint: Constraint, name: str, *, flag: str | None = None) -> Any:
    """Return ``value`` (in the constraint's canonical type) when it satisfies
    ``constraint``; else raise :class:`ArgumentError` naming ``name`` (Python) and
    ``flag`` (command line)."""
    error = violation(value, constraint, name, flag=flag)
    if error is not None:
        raise error
    return constraint.convert(value)


def parse_numbers(text: str, flag: str) -> list[int | float]:
    """The numbers of a comma-separated flag value (``"1e-3,1e-2"``), for :func:`check`
    with a :class:`Grid`; text that is not a number raises :class:`ArgumentError`."""
    values: list[int | float] = []
    for part in text.split(","):
        try:
            values.append(int(part))
        except ValueError:
            try:
                values.append(float(part))
            except ValueError:
                message = (
                    f"{flag} expects comma-separated numbers (e.g. {flag} 1e-3,1e-2), got {text!r}."
                )
                raise ArgumentError(message) from None
    return values
