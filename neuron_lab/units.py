"""Human-readable sizes and durations, shared by every layer's messages and renderers."""

from __future__ import annotations


def format_size(n: int) -> str:
    """Binary units, two decimals: ``format_size(3 * 2**20) == "3.00 MiB"``."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def format_delta(n: int) -> str:
    return ("+" if n >= 0 else "-") + format_size(abs(n))


def format_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"
