"""Named things users pick by name: one registry type for every family (planners, workloads,
machine presets, ops, kernels, backends, dispatch policies), after PuLP's ``getSolver`` and
``listSolvers``.

A :class:`Registry` is a dict from name to entry that refuses an unknown name with one line
listing the valid ones, and describes each entry (a one-line description and, where the family
has them, its options) for ``offloadlab list``.  Entries are registered where they are
defined, with :meth:`Registry.register` as a decorator or by assignment.

>>> COLOURS: Registry[int] = Registry("colour")
>>> COLOURS["red"] = 0xff0000
>>> COLOURS["blue"]
Traceback (most recent call last):
...
offloadlab.core.errors.SpecError: unknown colour 'blue'; known: red
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn, TypeVar

from .errors import SpecError

T = TypeVar("T")


def summary(doc: str | None) -> str:
    """A docstring's first paragraph on one line, without a closing stop or ``literal`` marks.

    The description ``offloadlab list`` shows.

    Parameters
    ----------
    doc : str or None
        The docstring.

    Returns
    -------
    str
    """
    paragraph = " ".join((doc or "").strip().split("\n\n", 1)[0].split())
    return paragraph.rstrip(".;:").replace("``", "")


def _docstring(value: object) -> str:
    return summary(getattr(value, "__doc__", None))


def _no_options(value: object) -> Mapping[str, object]:
    return {}


@dataclass(frozen=True)
class Entry:
    """How ``offloadlab list`` shows one entry: its name, a one-line description and its
    options with their defaults (none for a family without options)."""

    name: str
    doc: str
    options: Mapping[str, object] = field(default_factory=dict)


class Registry(dict[str, T]):
    """The entries of one family by name, in the order they were registered.

    Parameters
    ----------
    kind : str
        What an entry is, as an error names it (``"planner"``, ``"machine preset"``).
    error : type
        The exception an unknown name raises (a :class:`SpecError` unless the family has its
        own).
    listed : str
        The words before the list of valid names in that error (``"known"``,
        ``"valid policies"``).
    sort : bool
        List the names sorted (in errors and :meth:`entries`) instead of in registration
        order.
    doc, options : callable
        An entry's one-line description (default: its docstring's :func:`summary`) and its
        options with their defaults (default: none).
    within : Registry, optional
        A registry whose names are the only ones this one takes (the kernels' are the ops'):
        registering another name raises that registry's error.
    """

    def __init__(self, kind: str, *, error: type[Exception] = SpecError, listed: str = "known",
                 sort: bool = False, doc: Callable[[T], str] = _docstring,
                 options: Callable[[T], Mapping[str, object]] = _no_options,
                 within: Registry | None = None) -> None:
        super().__init__()
        self.kind, self.error, self.listed, self.sort = kind, error, listed, sort
        self._doc, self._options, self.within = doc, options, within

    def __setitem__(self, name: str, value: T) -> None:
        if self.within is not None:
            self.within.check(name)
        super().__setitem__(name, value)

    def update(self, entries: Mapping[str, T]) -> None:  # type: ignore[override]
        """Register every entry of ``entries``.

        Parameters
        ----------
        entries : mapping of str to entry
            The entries by name.
        """
        for name, value in entries.items():
            self[name] = value

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator registering what it decorates under ``name``.

        Parameters
        ----------
        name : str
            The entry's name.

        Returns
        -------
        callable
            The decorator; it returns what it decorates unchanged.
        """
        def deco(value: T) -> T:
            self[name] = value
            return value
        return deco

    def names(self) -> list[str]:
        """The valid names, in listing order.

        Returns
        -------
        list of str
        """
        return sorted(self) if self.sort else list(self)

    def unknown(self, name: object, note: str = "") -> Exception:
        """The error refusing ``name``: ``unknown KIND 'name'[ note]; known: a, b, c``.

        Parameters
        ----------
        name : object
            The name asked for.
        note : str
            Added after the name.

        Returns
        -------
        Exception
            The registry's error, to raise.
        """
        note = f" {note}" if note else ""
        return self.error(f"unknown {self.kind} {name!r}{note}; {self.listed}: "
                          f"{', '.join(self.names())}")

    def check(self, name: object) -> None:
        """Raise :meth:`unknown` unless ``name`` is registered.

        Parameters
        ----------
        name : object
            The name asked for.

        Raises
        ------
        SpecError
            Or the registry's own error: ``name`` is not registered.
        """
        if type(name) is not str or name not in self:
            raise self.unknown(name)

    def __missing__(self, name: str) -> NoReturn:
        raise self.unknown(name)

    def entry(self, name: str) -> Entry:
        """How ``offloadlab list`` shows entry ``name``.

        Parameters
        ----------
        name : str
            A registered name.

        Returns
        -------
        Entry

        Raises
        ------
        SpecError
            Or the registry's own error: ``name`` is not registered.
        """
        value = self[name]
        return Entry(name, self._doc(value), dict(self._options(value)))

    def entries(self) -> list[Entry]:
        """Every entry, in listing order.

        Returns
        -------
        list of Entry
        """
        return [self.entry(name) for name in self.names()]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
