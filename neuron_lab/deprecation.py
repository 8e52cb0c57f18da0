"""Old spellings that still work: one warning, worded once, for every renamed name, magic, flag or variable.

A FutureWarning, as PyTorch uses for user-facing deprecations: unlike DeprecationWarning, Python shows it for code
in any module, a notebook cell's included.
"""

from __future__ import annotations

import warnings


def renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is now spelled ``new``; the old spelling keeps working."""
    warnings.warn(f"{old} is deprecated: use {new} (the same thing under its new name)", FutureWarning,
                  stacklevel=stacklevel)
