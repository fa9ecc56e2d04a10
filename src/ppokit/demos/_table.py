"""Plain-text tables for the demos: right-aligned columns, one header row, a rule."""

from __future__ import annotations

from collections.abc import Sequence


def fmt(x: float, digits: int = 4, sign: bool = False) -> str:
    """``x`` with ``digits`` decimals; ``-0.0000`` is printed as ``0.0000``."""
    s = f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"
    if float(s) == 0.0:
        s = f"{0.0:+.{digits}f}" if sign else f"{0.0:.{digits}f}"
        if sign:
            s = " " + s[1:]
    return s


def vec(xs: Sequence[float], digits: int = 4) -> str:
    """A vector as ``[a b c]`` with fixed decimals and aligned signs."""
    width = digits + 3
    return "[" + " ".join(f"{fmt(float(x), digits):>{width}}" for x in xs) + "]"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, indent: int = 2,
          align: str | None = None) -> str:
    """Render rows of strings under ``headers``; ``align`` holds one 'l'/'r' per column
    (default: first column left, the rest right)."""
    ncol = len(headers)
    align = align or ("l" + "r" * (ncol - 1))
    widths = [max(len(headers[j]), *(len(r[j]) for r in rows)) if rows else len(headers[j])
              for j in range(ncol)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align)]
        return (" " * indent + "  ".join(parts)).rstrip()

    rule = " " * indent + "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def title(text: str) -> str:
    return f"{text}\n{'=' * len(text)}"
