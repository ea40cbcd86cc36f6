"""Parse ``NAME:key=value,key=value`` specifications (workloads, machine presets).

Values may be integers, floats (``4e9``), booleans, byte sizes (``64MiB``, ``1.5GB``) or
plain strings; :func:`_coerce` turns one into the type a field expects and refuses NaN, a
fraction where an integer is wanted, and infinity except for the rates that may be unlimited.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from .errors import SpecError

_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]+)\s*$")


def parse_bytes(text: str | int | float) -> int:
    """``"64MiB"`` -> 67108864; plain numbers are bytes and must be whole (``"4096"``, ``"4e9"``);
    with a unit the product is rounded to whole bytes (``"1.5KiB"`` -> 1536).

    Parameters
    ----------
    text : str, int or float
        The size, with or without a unit (``B``, ``KB``...``TB``, ``KiB``...``TiB``).

    Returns
    -------
    int
        The bytes.

    Raises
    ------
    SpecError
        Not a byte size, not finite, or a fraction of a byte without a unit.
    """
    if isinstance(text, bool):
        raise SpecError(f"not a byte size: {text!r}")
    if isinstance(text, (int, float)):
        value: float = text
        unit = 1
    else:
        m = _SIZE.match(text)
        if m and m.group(2).lower() in _UNITS:
            value, unit = float(m.group(1)), _UNITS[m.group(2).lower()]
        else:
            try:
                value, unit = float(text), 1
            except ValueError:
                raise SpecError(f"not a byte size: {text!r} (use e.g. 4096, 64MiB, "
                                f"1.5GB)") from None
    if not math.isfinite(value) or (unit == 1 and value != int(value)):
        raise SpecError(f"not a whole number of bytes: {text!r} (use e.g. 4096, 64MiB, 1.5GB)")
    return int(value) if unit == 1 else int(round(value * unit))


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``"NAME:k=v,k=v"`` into the name and a dict of raw string values.

    Parameters
    ----------
    spec : str
        The specification.

    Returns
    -------
    tuple of (str, dict of str to str)
        The name and its options, as given.

    Raises
    ------
    SpecError
        An empty name, an option that is not ``key=value``, or a key given twice.
    """
    name, _, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise SpecError(f"empty name in specification {spec!r}")
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise SpecError(f"bad option {item!r} in {spec!r}: expected key=value")
        if key in options:
            raise SpecError(f"option {key!r} given twice in {spec!r}")
        options[key] = value.strip()
    return name, options


def _coerce(value: str, like: object, where: str, unlimited: bool = False) -> object:
    """Convert the string ``value`` to the type of ``like`` (the field's default): a boolean,
    an integer (or a byte size: ``64MiB``), or a finite float (``inf`` too if ``unlimited``);
    NaN, fractions where an integer is wanted and infinities are refused."""
    try:
        if isinstance(like, bool):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if isinstance(like, int):
            return parse_bytes(value)
        if isinstance(like, float):
            number = float(value)
            if math.isnan(number) or (math.isinf(number) and not unlimited):
                raise ValueError(value)
            return number
    except (ValueError, SpecError):
        what = {bool: "a boolean (true/false)", int: "an integer or a byte size (64MiB)",
                float: "a finite number" + (" or inf" if unlimited else "")}[type(like)]
        raise SpecError(f"{where}: cannot read {value!r} as {what}") from None
    return value


def apply_options(defaults: dict[str, object], options: dict[str, str], where: str,
                  unlimited: Iterable[str] = ()) -> dict[str, object]:
    """Overlay string ``options`` onto ``defaults``, rejecting unknown keys by name.

    Parameters
    ----------
    defaults : dict
        The known options and their defaults, whose types the values are read as.
    options : dict of str to str
        The options given (:func:`parse_spec`).
    where : str
        Names the thing specified in an error.
    unlimited : iterable of str, default ()
        The float options that may be ``inf``.

    Returns
    -------
    dict
        ``defaults`` with the given options read as their types.

    Raises
    ------
    SpecError
        An unknown option, or a value that cannot be read as its option's type.
    """
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise SpecError(f"{where}: unknown option(s) {', '.join(unknown)}; "
                        + (f"known: {', '.join(sorted(defaults))}" if defaults else
                           "it takes none"))
    unlimited = set(unlimited)
    merged = dict(defaults)
    for key, raw in options.items():
        merged[key] = _coerce(raw, defaults[key], f"{where} option {key}", key in unlimited)
    return merged
