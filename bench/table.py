"""Every bench figure in one table, with its target and whether it holds; and two runs compared.

The bench scripts `make bench` runs write their figures (bench/figures.py's format) into one folder; this
gathers them, prints the table and writes them all as one JSON file, so a branch's run can be set beside
main's:

    python bench/table.py out/bench/*.json --out out/bench.json
    python bench/table.py --compare main.json branch.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _value(f: dict) -> str:
    v, unit = f["value"], f["unit"]
    return f"{v:.3f}x" if unit == "x" else f"{v:+.1f} {unit}" if unit in ("us", "%") else f"{v:.2f} {unit}"


def _range(pair: list[float] | None) -> str:
    return "-" if pair is None else f"{pair[0]:.3f}-{pair[1]:.3f}"


def _target(f: dict) -> str:
    return "-" if f.get("target") is None else f"<= {f['target']:g}{f['unit'] if f['unit'] == 'x' else ' ' + f['unit']}"


def _holds(f: dict) -> str:
    return "-" if f.get("holds") is None else "yes" if f["holds"] else "NO"


def gather(paths: list[str]) -> list[dict]:
    out = []
    for p in paths:
        for f in json.loads(Path(p).read_text()).get("figures", []):
            out.append({**f, "source": Path(p).stem})
    return out


def table(figs: list[dict]) -> str:
    """Holds: the median at or under the target; the 95% CI of the median says whether the rounds resolve it."""
    lines = ["| figure | measured | spread (IQR) | 95% CI | target | holds |", "|---|---|---|---|---|---|"]
    for f in figs:
        lines.append(f"| {f['name']} | {_value(f)} | {_range(f.get('spread'))} | {_range(f.get('ci'))} | "
                     f"{_target(f)} | {_holds(f)} |")
    return "\n".join(lines)


def _overlap(a: dict, b: dict) -> bool:
    """Whether two runs' interquartile ranges meet: a change inside both runs' spread is not one yet."""
    (a0, a1), (b0, b1) = a.get("spread") or (a["value"],) * 2, b.get("spread") or (b["value"],) * 2
    return a0 <= b1 and b0 <= a1


def compare(old: list[dict], new: list[dict]) -> str:
    before, after = {f["name"]: f for f in old}, {f["name"] for f in new}
    lines = ["| figure | before | after | change | target | holds (before → after) |", "|---|---|---|---|---|---|"]
    for f in new:
        b = before.get(f["name"])
        change = "-" if not (b and b["value"]) else (f"{(f['value'] - b['value']) / b['value']:+.0%}"
                                                     + (" (within spread)" if _overlap(b, f) else ""))
        lines.append(f"| {f['name']} | {_value(b) if b else '-'} | {_value(f)} | {change} | {_target(f)} | "
                     f"{_holds(b) if b else '-'} → {_holds(f)} |")
    for f in old:
        if f["name"] not in after:
            lines.append(f"| {f['name']} | {_value(f)} | - (not measured) | - | {_target(f)} | {_holds(f)} → - |")
    return "\n".join(lines)


def write(path: str, figs: list[dict], run: dict | None = None) -> None:
    """Every figure in one JSON file (``run``: when and where it was measured, for the record)."""
    Path(path).write_text(json.dumps({"run": run or {}, "figures": figs}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="figure files written by the bench scripts")
    ap.add_argument("--out", help="write the gathered figures here as one JSON file")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="two gathered JSON files, side by side")
    args = ap.parse_args()
    if args.compare:
        old, new = (json.loads(Path(p).read_text())["figures"] for p in args.compare)
        print(compare(old, new))
        return
    if not args.files:
        sys.exit("no figure files given")
    figs = gather(args.files)
    print(table(figs))
    if args.out:
        write(args.out, figs)


if __name__ == "__main__":
    main()
