"""One registry mechanism: a name maps to a builder (or a description of one).

Models, datasets, training methods and calibrators are each a :class:`Registry`: entries
are added by :meth:`Registry.register` (a decorator or a call), listed by
:meth:`Registry.names`, and looked up by :meth:`Registry.get`, which matches names
case-insensitively and raises one :class:`~cogcal._errors.ArgumentError` for an unknown
name: it lists the known names and suggests the closest, naming the Python argument and
the command-line flag.

>>> shapes = Registry("shape", argument="shape", flag="--shape")
>>> @shapes.register("Square")
... def square(side):
...     return side * side
>>> shapes.get("square")(3), shapes.names(), "SQUARE" in shapes
(9, ['Square'], True)
>>> shapes.get("squar")
Traceback (most recent call last):
...
cogcal._errors.ArgumentError: unknown shape 'squar'. Did you mean 'Square'? Known: Square.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, overload

from cogcal._errors import ArgumentError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Names mapped to entries, looked up case-insensitively.

    Parameters
    ----------
    kind : str
        What an entry is, for messages (``"model"``, ``"dataset"``).
    argument : str, optional
        The Python argument that takes a name (``"model"``); defaults to ``kind``.
    flag : str, optional
        The command-line flag that takes a name (``"--model"``); defaults to
        ``"--" + argument``.
    sort : bool
        List names sorted (default) or in registration order.
    unknown : str
        The message for an unknown name, a ``str.format`` template with the fields
        ``kind``, ``name`` (the name as given), ``hint`` (" Did you mean 'x'?" or empty),
        ``known`` (the names, comma-separated), ``known_repr`` (the same, quoted) and ``who`` (```argument``` in Python, the
        flag on the command line). A template without ``{who}`` gets ``"FLAG: "`` in front
        on the command line.
    cutoff : float
        How close (``difflib`` ratio, 0-1) a known name must be to an unknown one to be
        suggested.
    """

    def __init__(
        self,
        kind: str,
        *,
        argument: str | None = None,
        flag: str | None = None,
        sort: bool = True,
        unknown: str = "unknown {kind} {name!r}.{hint} Known: {known}.",
        cutoff: float = 0.6,
    ) -> None:
        self.kind = kind
        self.argument = argument or kind
        self.flag = flag or f"--{self.argument}"
        self._sort = sort
        self._unknown = unknown
        self._cutoff = cutoff
        self._entries: dict[str, T] = {}

    @overload
    def register(self, name: str, entry: T, *, overwrite: bool = ...) -> T: ...

    @overload
    def register(
        self, name: str, entry: None = ..., *, overwrite: bool = ...
    ) -> Callable[[T], T]: ...

    def register(self, name: str, entry: T | None = None, *, overwrite: bool = False) -> Any:
        """Add ``entry`` under ``name``; without ``entry``, a decorator that adds what it wraps.

        A name already registered (case-insensitively) raises ``ValueError`` unless
        ``overwrite=True``, which replaces it.
        """
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}.")

        def add(obj: T) -> T:
            same = self.key(name)
            if same is not None:
                if not overwrite:
                    raise ValueError(
                        f"a {self.kind} named {same!r} is already registered (names are matched "
                        "case-insensitively); pass overwrite=True to replace it."
                    )
                del self._entries[same]
            self._entries[name] = obj
            return obj

        return add if entry is None else add(entry)

    def unregister(self, name: str) -> T:
        """Remove and return the entry called ``name`` (unknown names raise as :meth:`get`)."""
        return self._entries.pop(self._key_or_raise(name))

    def key(self, name: Any) -> str | None:
        """The registered name matching ``name`` case-insensitively, or ``None``."""
        if not isinstance(name, str):
            return None
        if name in self._entries:
            return name
        folded = name.strip().casefold()
        return next((k for k in self._entries if k.casefold() == folded), None)

    def get(self, name: Any) -> T:
        """The entry called ``name``; an unknown name raises :class:`ArgumentError`."""
        return self._entries[self._key_or_raise(name)]

    def names(self) -> list[str]:
        """The registered names, sorted (or in registration order with ``sort=False``)."""
        return sorted(self._entries) if self._sort else list(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """``(name, entry)`` pairs in the order of :meth:`names`."""
        return [(k, self._entries[k]) for k in self.names()]

    def __contains__(self, name: object) -> bool:
        return self.key(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()!r})"

    def _key_or_raise(self, name: Any) -> str:
        key = self.key(name)
        if key is not None:
            return key
        names = self.names()
        folded = [n.casefold() for n in names]
        close = difflib.get_close_matches(str(name).casefold(), folded, n=1, cutoff=self._cutoff)
        match = next((n for n in names if close and n.casefold() == close[0]), None)
        hint = f" Did you mean {match!r}?" if match else ""
        fields = {
            "kind": self.kind,
            "name": name,
            "hint": hint,
            "known": ", ".join(names),
            "known_repr": ", ".join(map(repr, names)),
        }
        message = self._unknown.format(who=f"`{self.argument}`", **fields)
        cli = self._unknown.format(who=self.flag, **fields)
        if "{who}" not in self._unknown:
            cli = f"{self.flag}: {cli}"
        raise ArgumentError(message, cli_message=cli)
