"""LaTeX macros for every number the text quotes, each traced to where it came from.

``Generated/numbers.tex`` holds one ``\\newcommand`` per number, preceded by a comment
naming its results file and field (or, for the design section, the source constant). A
figure declares its macros up front (:attr:`paper.figures.FigureSpec.macros`); when its
results are absent each one is defined as a visible ``[n/a]`` with the reason, so the
text still builds and nobody mistakes a gap for a number.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from .spread import Spread, fmt

_NAME_RE = re.compile(r"^[A-Za-z]+$")
MISSING = r"\textbf{[n/a]}"


def check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise ValueError(f"macro name {name!r}: LaTeX macro names are letters only")
    return name


def _group(digits: str) -> str:
    """Thin-space thousands groups for numbers of five or more integer digits (SI style:
    ``4096`` stays, ``65536 -> '65\\,536'``)."""
    sign, digits = ("-", digits[1:]) if digits.startswith("-") else ("", digits)
    head, dot, tail = digits.partition(".")
    if len(head) >= 5:
        head = f"{int(head):,}".replace(",", r"\,")
    return sign + head + dot + tail


def sig(x: float, digits: int = 3, *, around: float | None = None) -> str:
    """``x`` to ``digits`` significant figures, but never rounding integer digits away
    and without exponent notation (``12.74 -> '12.7'``, ``0.31234 -> '0.312'``,
    ``1234.5 -> '1234'``). A measured :class:`~paper.spread.Spread` reads
    ``median (min--max)``; where its range holds the threshold ``around`` but its min and
    max round alike, it gets one more digit, so that the range shows."""
    if around is not None and isinstance(x, Spread) and x.varies and x.lo <= around <= x.hi \
            and _rounded(x.lo, digits) == _rounded(x.hi, digits):
        digits += 1
    return fmt(x, lambda v: _sig(v, digits))


def _rounded(x: float, digits: int) -> float:
    """The number :func:`_sig` prints: ``0.998`` and ``1.003`` both round to 1 at two
    digits, though printed ``1.00`` and ``1.0``."""
    return float(_sig(x, digits).replace(r"\,", ""))


def _sig(x: float, digits: int) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    decimals = max(digits - 1 - int(math.floor(math.log10(abs(x)))), 0)
    return _group(f"{x:.{decimals}f}")


def pct(fraction: float, decimals: int = 1) -> str:
    """A fraction as a percentage number (``0.3412 -> '34.1'``); the text adds ``\\%``."""
    return fmt(fraction, lambda v: f"{100 * v:.{decimals}f}")


def integer(x: float) -> str:
    """An integer, grouped as :func:`_group` does (``65536 -> '65\\,536'``)."""
    return fmt(x, lambda v: _group(str(int(round(v)))))


def size(nbytes: float) -> str:
    """``4194304 -> '4\\,MiB'`` (binary units, for block sizes)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            v = nbytes / (1 << shift)
            return f"{v:.3g}" + r"\," + unit
    return f"{int(nbytes)}\\,B"


#: The block sizes the text quotes side by side wherever a run measured them.
QUOTED_SIZES = (2 << 20, 16 << 20)


def quoted_sizes(measured: list[int], fallback: int) -> list[int]:
    """The sizes of :data:`QUOTED_SIZES` a run measured, in order; ``[fallback]`` if none."""
    found = [s for s in QUOTED_SIZES if s in measured]
    return found or [fallback]


def and_list(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def per_size(values: list[tuple[int, str]], unit: str = "") -> str:
    r"""``"9.1\,GB/s at 2\,MiB and 8.0\,GB/s at 16\,MiB"``: one formatted value per block size
    (``unit`` appended to each), so a sentence quotes every quoted size at once."""
    return and_list([f"{v}{unit} at {size(s)}" for s, v in values])


@dataclass
class Macro:
    name: str
    value: str
    source: str


class MacroBook:
    """Macros collected while figures are built; written once at the end."""

    def __init__(self) -> None:
        self._macros: dict[str, Macro] = {}

    def add(self, name: str, value: str, source: str) -> None:
        """Define ``\\name`` as ``value`` (already formatted), traced to ``source``."""
        check_name(name)
        if name in self._macros:
            raise ValueError(f"macro \\{name} defined twice ({self._macros[name].source}; {source})")
        self._macros[name] = Macro(name, value, source.replace("\n", " "))

    def missing(self, name: str, reason: str) -> None:
        """Define ``\\name`` as a visible placeholder: its results are absent."""
        self.add(name, MISSING, f"NOT GENERATED: {reason}")

    def discard(self, names: set[str]) -> None:
        for name in names:
            self._macros.pop(name, None)

    def names(self) -> set[str]:
        return set(self._macros)

    def __contains__(self, name: str) -> bool:
        return name in self._macros

    def value(self, name: str) -> str:
        return self._macros[name].value

    def write(self, path: Path, header: str) -> Path:
        lines = [f"% {line}" for line in header.splitlines()] + [""]
        for m in sorted(self._macros.values(), key=lambda m: m.name):
            lines.append(f"% {m.source}")
            lines.append(f"\\newcommand{{\\{m.name}}}{{{m.value}\\xspace}}")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(path)
        return path
