"""Texts a renderer made from objects, kept by the objects' identity: a report's text and HTML each format the same
rows, and the look-up must cost less than the format (a dataclass's hash, or a nested tuple's, is not cheap)."""

from __future__ import annotations

from typing import Any


class ByIdentity:
    """Texts keyed by the identity of two objects; an entry holds its objects, so their ids are not reused while it is
    kept. Readers look up :attr:`texts` themselves (``texts.get((id(a), id(b)))``: one dict look-up, no call)."""

    def __init__(self, size: int = 1024) -> None:
        self.texts: dict[tuple[int, int], tuple[Any, Any, str]] = {}
        self._size = size  # past it, the texts are made afresh

    def keep(self, a: Any, b: Any, text: str) -> str:
        if len(self.texts) >= self._size:
            self.texts.clear()
        self.texts[(id(a), id(b))] = (a, b, text)
        return text
