"""Where a `dvc repro` spends its time, read from its own log.

    (/usr/bin/time -v dvc repro) > repro.log 2>&1
    python benchmarks/repro_time.py repro.log --json benchmarks/repro_time.json --note "fresh clone, quiet"
    python benchmarks/repro_time.py --table benchmarks/repro_time.json

Each stage logs ``HH:MM:SS INFO lexgraph: stage NAME (i of n)`` as it starts and ``stage NAME done
in S s`` as it ends (:mod:`lexgraph.core.progress`). A stage's wall time here runs from its start
line to the next stage's (Python start-up and DVC's own bookkeeping included); the last one ends
at the log's last timestamp. The total is ``/usr/bin/time -v``'s elapsed wall clock when the log
holds it, else the sum. Stages run by one ``dvc repro`` never overlap, so the rows add up.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

START = re.compile(r"^(\d\d):(\d\d):(\d\d) INFO lexgraph: stage (\S+) \((\d+) of (\d+)\)")
DONE = re.compile(r"^(\d\d):(\d\d):(\d\d) INFO lexgraph: stage (\S+) done in ([\d.]+) s")
STAMP = re.compile(r"^(\d\d):(\d\d):(\d\d) ")
ELAPSED = re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)")


def _seconds(h: str, m: str, s: str) -> int:
    return int(h) * 3600 + int(m) * 60 + int(s)


def parse(text: str) -> dict:
    """The stages in run order, each with its wall seconds (start to next start) and its own
    ``done in`` figure; the total."""
    starts, done, last, day = [], {}, None, 0
    for line in text.splitlines():
        stamp = STAMP.match(line)
        if stamp:
            now = _seconds(*stamp.groups()) + day
            if last is not None and now < last - 3600:  # past midnight
                day += 86400
                now += 86400
            last = now
        found = START.match(line)
        if found:
            starts.append((found.group(4), last))
        found = DONE.match(line)
        if found:
            done.setdefault(len(starts) - 1, float(found.group(5)))
    stages = []
    for i, (name, at) in enumerate(starts):
        end = starts[i + 1][1] if i + 1 < len(starts) else last
        stages.append({"stage": name, "wall_s": end - at, "own_s": done.get(i)})
    elapsed = ELAPSED.search(text)
    total = (
        round(_seconds(elapsed.group(1) or "0", elapsed.group(2), "0") + float(elapsed.group(3)), 1)
        if elapsed
        else sum(s["wall_s"] for s in stages)
    )
    return {"stages": stages, "total_s": total}


def table(result: dict) -> str:
    rows = ["| stage | wall (s) | the stage's own (s) |", "|:---|---:|---:|"]
    for s in result["stages"]:
        own = "" if s["own_s"] is None else f"{s['own_s']:.1f}"
        rows.append(f"| {s['stage']} | {s['wall_s']} | {own} |")
    total = result["total_s"]
    rows.append(f"| **total** | **{total:.0f}** ({int(total // 60)} min {total % 60:.0f} s) | |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, nargs="?")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--note", default="", help="how the run was made (clone, load)")
    parser.add_argument("--table", type=Path, help="print the Markdown table of a saved result")
    args = parser.parse_args(argv)
    if args.table:
        sys.stdout.write(table(json.loads(args.table.read_text(encoding="utf-8"))) + "\n")
        return 0
    if args.log is None:
        parser.error("give a dvc repro log or --table")
    result = parse(args.log.read_text(encoding="utf-8", errors="replace"))
    from lexgraph.core.machine import describe

    result = {**result, "machine": describe(), "note": args.note}
    if args.json:
        from lexgraph.core.io import write_json

        write_json(result, args.json, indent=1)
    else:
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
