"""Values with a unit, read as the docs write them: sizes (``32 MiB``) and durations (``30 s``).

The settings take a plain number in the setting's own unit (bytes, seconds, milliseconds, as its
name says) or a number with a unit, with or without a space. Sizes: ``B``; ``KB``, ``MB``,
``GB`` (powers of 1000); ``KiB``, ``MiB``, ``GiB`` (powers of 1024; ``Ki``, ``Mi``, ``Gi`` as
Kubernetes writes them). A bare ``K``, ``M`` or ``G`` is refused: nginx and Docker read ``32m``
as MiB, Kubernetes reads ``32M`` as MB. Durations: ``us`` (``µs``), ``ms``, ``s``, ``m``
(``min``), ``h``. Pure: the settings call these from their validators.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_NUMBER = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-zµ]*)\s*$")

SIZES: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
}
AMBIGUOUS_SIZES = ("k", "m", "g")

SECONDS: dict[str, float] = {
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
}


def _split(text: str) -> tuple[float, str] | None:
    found = _NUMBER.match(text)
    if found is None:
        return None
    return float(found.group(1)), found.group(2)


def parse_size(text: str) -> int:
    """Bytes in ``text`` (``33554432``, ``32MiB``, ``32 MiB``, ``32 MB``); ``ValueError`` saying
    what is accepted."""
    parts = _split(text)
    if parts is not None:
        number, unit = parts
        factor = SIZES.get(unit.lower(), 1 if unit == "" else None)
        if factor is not None:
            value = number * factor
            if value != int(value):
                raise ValueError(f"{text!r} is not a whole number of bytes")
            return int(value)
        if unit.lower() in AMBIGUOUS_SIZES:
            raise ValueError(
                f"{text!r} is ambiguous: write {number:g}MiB (powers of 1024) or {number:g}MB "
                "(powers of 1000)"
            )
    raise ValueError(
        f"expected bytes, optionally with a unit: 33554432, 32MiB, 32 MiB, 32MB (got {text!r})"
    )


def parse_duration(text: str, unit: str = "s") -> float:
    """``text`` in ``unit`` (one of ``SECONDS``' keys): a plain number is already in it, a
    number with a unit is converted (``30 s``, ``500ms``, ``2m``); ``ValueError`` otherwise."""
    parts = _split(text)
    if parts is not None:
        number, given = parts
        if given == "":
            return number
        factor = SECONDS.get(given.lower() if given != "µs" else given)
        if factor is not None:
            return number * factor / SECONDS[unit]
    examples = {"s": "30, 30s, 30 s, 500ms, 2m", "ms": "1000, 1000ms, 1 s", "us": "50, 50us"}
    shown = examples.get(unit, f"10{unit}")
    raise ValueError(
        f"expected a duration in {unit}, optionally with a unit: {shown} (got {text!r})"
    )


def size_field(value: object) -> object:
    """A pydantic before-validator: a string is read by ``parse_size``, anything else passes."""
    return parse_size(value) if isinstance(value, str) else value


def duration_field(unit: str = "s", whole: bool = False) -> Callable[[object], object]:
    """A pydantic before-validator for a duration kept in ``unit`` (``whole``: rounded to a
    whole number of it, for a setting that is an integer: ``0.05ms`` is 50 µs, not
    50.00000000000001)."""

    def read(value: object) -> object:
        if not isinstance(value, str):
            return value
        number = parse_duration(value, unit)
        return round(number) if whole and abs(number - round(number)) < 1e-6 else number

    return read
