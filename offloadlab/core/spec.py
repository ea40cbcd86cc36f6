"""Parse ``NAME:key=value,key=value`` specifications (workloads, machine presets).

Values may be integers, floats (``4e9``), booleans, byte sizes (``64MiB``, ``1.5GB``) or
plain strings; :func:`coerce` turns one into the type a field expects.
"""

from __future__ import annotations

import re

from .errors import SpecError

_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]+)\s*$")


def parse_bytes(text: str | int | float) -> int:
    """``"64MiB"`` -> 67108864; plain numbers are bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    m = _SIZE.match(text)
    if m and m.group(2).lower() in _UNITS:
        return int(round(float(m.group(1)) * _UNITS[m.group(2).lower()]))
    try:
        return int(float(text))
    except ValueError:
        raise SpecError(f"not a byte size: {text!r} (use e.g. 4096, 64MiB, 1.5GB)") from None


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``"NAME:k=v,k=v"`` into the name and a dict of raw string values."""
    name, _, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise SpecError(f"empty name in specification {spec!r}")
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise SpecError(f"bad option {item!r} in {spec!r}: expected key=value")
        options[key.strip()] = value.strip()
    return name, options


def coerce(value: str, like: object, where: str) -> object:
    """Convert the string ``value`` to the type of ``like`` (the field's default)."""
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
            return float(value)
    except (ValueError, SpecError):
        raise SpecError(f"{where}: cannot read {value!r} as {type(like).__name__}") from None
    return value


def apply_options(defaults: dict[str, object], options: dict[str, str], where: str) -> dict[str, object]:
    """Overlay string ``options`` onto ``defaults``, rejecting unknown keys by name."""
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise SpecError(f"{where}: unknown option(s) {', '.join(unknown)}; "
                        f"known: {', '.join(sorted(defaults))}")
    merged = dict(defaults)
    for key, raw in options.items():
        merged[key] = coerce(raw, defaults[key], f"{where} option {key}")
    return merged
