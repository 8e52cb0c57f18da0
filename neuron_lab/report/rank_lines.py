"""The lines several ranks print, read as one program's: a line every rank printed alike once, with its ranks.

The k-th line of one shape on each rank is one group (the shape: the line with the numbers taken out, and what
differs only because each rank is its own process made alike: IPython's per-process cell files, c10d's timestamp,
thread and ``[rankN]:`` tag, gloo's "Rank N is connected"). A group is shown once every rank still running has
printed it, or once it waited a window: then with the ranks that had printed it, and a rank printing it later shows
its own line. When the ranks' numbers differ the group is shown once with each rank's value and the ranks whose value
stands apart marked (``[ranks 0-3] loss {0: 0.51, 1: 0.50, 2: 0.52, 3: 0.93 ← rank 3}``); a line that names its own
rank (``rank 1 of 2``) is each rank's own. Each rank's lines keep their order. :class:`Collapser` does it as lines
come (``%%neuron ranks`` cells); :func:`collapse` once every rank is done (``neuron-lab run --nproc``, held stderr).
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from neuron_lab.report.ranks import outliers, ranks_label

STDOUT = ("[stdout:{ranks}] ", "[ranks {ranks}] ")  # how a line is prefixed: one rank's, several ranks'
# a number in a line; captured, so that splitting a line on it gives its words and numbers in turn
NUMBER = re.compile(r"((?<![\w.])[-+]?(?:\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|inf)(?!\w|\.\d))")
# c10d's tag on a log line of a rank in a process group: the line is said alike by every rank, not of its own rank
_RANK_TAG = re.compile(r"^\[rank\d+\]:(?=\[[WIEF]\d{4} )")
_OWN_PROCESS = [  # (what differs between ranks in a line that says the same thing on each, what it becomes, a text
    # every line it differs in holds: most lines hold none, and looking for a text costs less than a pattern's sub)
    (re.compile(r"ipykernel_\d+"), "ipykernel_*", "ipykernel_"),  # ipykernel names a cell's file after the process
    (_RANK_TAG, "", "[rank"),
    (re.compile(r"^\[([WIEF])\d{4} \d\d:\d\d:\d\d\.\d+ (?:\d+ )?"), r"[\1 ", "["),  # c10's log prefix: date, time,
    # thread (left out by a build that logs no thread)
    (re.compile(r"\[Gloo\] Rank \d+ is connected to"), "[Gloo] Rank * is connected to", "[Gloo] Rank "),
]


def alike(text: str) -> str:
    """``text`` with what each rank's process writes its own way made the same."""
    for pattern, same, held in _OWN_PROCESS:
        if held in text:
            text = pattern.sub(same, text)
    return text


@dataclass(eq=False)
class _Group:
    texts: dict[int, str]  # rank: its line, for the ranks whose line waits to be shown with the group
    first_s: float  # when its first line came
    pieces: dict[int, list[str]] = field(default_factory=dict)  # rank: its line made alike, split on NUMBER
    shown: bool = False  # a rank printing it from now on shows its own line


@dataclass
class Collapser:
    """Lines as the ranks print them (:meth:`add`), out as they can be shown; ``window_s``: how long a line waits
    for the other ranks; ``values``: lines differing only in numbers are one group (else: only lines alike)."""

    ranks: Iterable[int]
    window_s: float = math.inf
    prefixes: tuple[str, str] = STDOUT
    values: bool = True
    clock: Callable[[], float] = time.monotonic
    running: set[int] = field(init=False)

    def __post_init__(self) -> None:
        self.running = set(self.ranks)
        self._queues: dict[int, deque[tuple[_Group, str]]] = {rank: deque() for rank in self.running}
        self._groups: dict[tuple[str, int], _Group] = {}
        self._seen: dict[int, dict[str, int]] = {rank: {} for rank in self.running}  # rank: lines of each shape

    def add(self, rank: int, text: str) -> list[str]:
        """Rank ``rank`` printed the line ``text``: the lines that can be shown now."""
        self._add(rank, text)
        return self.due()

    def _add(self, rank: int, text: str) -> None:
        same = alike(text)
        pieces = NUMBER.split(same) if self.values else [same]
        shape = "#".join(pieces[::2])
        seen = self._seen[rank]
        key = (shape, seen.get(shape, 0))  # a Counter's missing key is a Python call
        seen[shape] = key[1] + 1
        group = self._groups.get(key)
        if group is None:  # the line's group is new: made once, not once a rank
            group = self._groups[key] = _Group({}, self.clock())
        if not group.shown:
            group.texts[rank] = text
            group.pieces[rank] = pieces
        self._queues[rank].append((group, text))

    def leave(self, rank: int) -> list[str]:
        """Rank ``rank`` ended its cell and will print nothing more: lines waiting only for it can be shown."""
        self.running.discard(rank)
        return self.due()

    def due(self) -> list[str]:
        """The lines that can be shown now: their group is complete, or waited its window."""
        return self._pump(self.clock())

    def end(self) -> list[str]:
        """Every line not shown yet (the ranks are done)."""
        return self._pump(math.inf)

    def _pump(self, now: float) -> list[str]:
        out: list[str] = []
        moved = True
        while moved:
            moved = False
            for rank, queue in self._queues.items():
                while queue:
                    group, text = queue[0]
                    if group.shown:  # printed late: its own line
                        queue.popleft()
                        out += self._render({rank: text}, group.pieces)
                        continue
                    heads = {q: t for q, t in group.texts.items() if self._queues[q] and self._queues[q][0][0] is group}
                    complete = self.running <= heads.keys() and len(heads) == len(group.texts)
                    if not (complete or now - group.first_s >= self.window_s):
                        break
                    for q in heads:
                        self._queues[q].popleft()
                    group.shown, moved = True, True
                    out += self._render(heads, group.pieces)
        return out

    def _render(self, texts: dict[int, str], pieces: dict[int, list[str]]) -> list[str]:
        one, many = self.prefixes
        ranks = sorted(texts)
        line = _ranks_line(texts, pieces) if len(ranks) > 1 else ""
        if not line:
            return [one.format(ranks=rank) + texts[rank] for rank in ranks]
        return [many.format(ranks=ranks_label(ranks)) + line]


def _ranks_line(texts: dict[int, str], pieces: dict[int, list[str]]) -> str:
    """The ranks' lines as one, each number that differs as every rank's value, the ranks that stand apart marked;
    "" when a number that differs is each rank's own rank (the line is each rank's own). ``pieces``: each rank's
    line made alike and split into its words and numbers in turn (one shape: the same words)."""
    ranks = sorted(texts)
    first = pieces[ranks[0]]
    if all(pieces[rank] == first for rank in ranks):  # the first rank's line, less a tag naming that rank alone
        return _RANK_TAG.sub("", next(iter(texts.values())))
    parts = [first[0]]
    for i in range(1, len(first), 2):
        shown = {rank: pieces[rank][i] for rank in ranks}
        if len(set(shown.values())) == 1:
            parts.append(first[i])
        else:
            numbers = {rank: float(v) for rank, v in shown.items()}
            if all(v == rank for rank, v in numbers.items()):
                return ""
            odd = outliers(numbers)
            mark = f" ← {'rank' if len(odd) == 1 else 'ranks'} {ranks_label(odd)}" if odd else ""
            parts.append("{" + ", ".join([f"{rank}: {v}" for rank, v in shown.items()]) + mark + "}")
        parts.append(first[i + 1])
    return "".join(parts)


def collapse(texts: dict[int, list[str]], prefixes: tuple[str, str] = STDOUT, *, values: bool = True) -> list[str]:
    """``texts`` (rank: its lines, in order, every rank done) as :class:`Collapser` shows them."""
    lines = Collapser(texts, prefixes=prefixes, values=values)
    for rank, said in texts.items():
        for text in said:
            lines._add(rank, text)
    return lines.end()
