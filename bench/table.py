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
    return f"{v:.2f}{unit}" if unit == "x" else f"{v:+.1f} {unit}" if unit in ("us", "%") else f"{v:.2f} {unit}"


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
    lines = ["| figure | measured | spread (IQR) | target | holds |", "|---|---|---|---|---|"]
    for f in figs:
        lo, hi = f.get("spread") or (f["value"], f["value"])
        lines.append(f"| {f['name']} | {_value(f)} | {lo:.2f}-{hi:.2f} | {_target(f)} | {_holds(f)} |")
    return "\n".join(lines)


def compare(old: list[dict], new: list[dict]) -> str:
    before = {f["name"]: f for f in old}
    lines = ["| figure | before | after | change | target | holds (after) |", "|---|---|---|---|---|---|"]
    for f in new:
        b = before.get(f["name"])
        change = f"{(f['value'] - b['value']) / b['value']:+.0%}" if b and b["value"] else "-"
        lines.append(f"| {f['name']} | {_value(b) if b else '-'} | {_value(f)} | {change} | {_target(f)} | "
                     f"{_holds(f)} |")
    return "\n".join(lines)


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
        Path(args.out).write_text(json.dumps({"figures": figs}, indent=1))


if __name__ == "__main__":
    main()
