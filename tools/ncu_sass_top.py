"""Reads the per-instruction source page of an ncu report (`ncu -i R --page source --csv
--print-source sass`, as tools/ncu_source.sh writes it, gzipped or not) and prints, for each kernel,
its warp-stall samples by reason and the instructions holding the most samples, each with its
leading reasons (issue 14 and 16's profiles).

    python3 tools/ncu_sass_top.py FILE.csv[.gz] [--top N] [--kernel SUBSTRING] [--segments] [--by-count]"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import re
import sys
from collections import Counter


def kernels(text: str) -> list[tuple[str, list[dict[str, str]]]]:
    """The page's kernels, each with its instruction rows (a dict per row, keyed by column)."""
    out: list[tuple[str, list[dict[str, str]]]] = []
    header: list[str] | None = None
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            out.append((row[1], []))
            header = None
        elif row[0] == "Address":
            header = row
        elif header is not None and out:
            out[-1][1].append(dict(zip(header, row)))
    return out


def num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def _opcode(src: str) -> str:
    """The opcode of a SASS line, without its predicate and modifiers."""
    words = src.strip().split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--kernel", default="")
    p.add_argument("--segments", action="store_true",
                   help="also the samples between consecutive wgmma / barrier / wait instructions, in program order")
    p.add_argument("--by-count", action="store_true",
                   help="also the instructions grouped by how many times each ran (a kernel's loop structure: "
                        "once a work tile, once a key tile, spin loops), with their samples")
    a = p.parse_args(argv)
    raw = open(a.file, "rb").read()
    text = (gzip.decompress(raw) if a.file.endswith(".gz") else raw).decode()
    for name, rows in kernels(text):
        if a.kernel not in name:
            continue
        reasons = [c for c in (rows[0] if rows else {}) if c.startswith("stall_") and "Not Issued" not in c]
        total = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in rows)
        by = Counter({c: sum(num(r[c]) for r in rows) for c in reasons})
        # samples of reasons the page has no column for (wgmma waits: stall_gmma) as "other"
        by["stall_other"] = total - sum(by.values())
        print(f"== {name}: {len(rows)} instructions, {total:.0f} samples")
        print("   " + ", ".join(f"{c[6:]} {100 * v / total:.1f}%" for c, v in by.most_common(10)))
        top = sorted(range(len(rows)), key=lambda i: -num(rows[i]["Warp Stall Sampling (All Samples)"]))[: a.top]
        for i in sorted(top):
            r = rows[i]
            s = num(r["Warp Stall Sampling (All Samples)"])
            named = [(num(r[c]), c[6:]) for c in reasons]
            named.append((s - sum(v for v, _ in named), "other"))
            lead = sorted(named, reverse=True)[:3]
            why = " ".join(f"{c}:{v:.0f}" for v, c in lead if v)
            print(f"{i:5d} {100 * s / total:5.2f}% {r['Source'].strip()[:70]:70s} {why}")
        if a.by_count:
            print("   by execution count (warp-level: count, instructions, executed, % of executed, % of samples; the 8 largest):")
            groups: dict[int, list[dict[str, str]]] = {}
            for r in rows:
                groups.setdefault(int(num(r.get("Instructions Executed", "0"))), []).append(r)
            executed = sum(c * len(g) for c, g in groups.items()) or 1
            for c, g in sorted(groups.items(), key=lambda kv: -kv[0] * len(kv[1]))[:8]:
                smp = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in g)
                ops = Counter(_opcode(r["Source"]) for r in g).most_common(3)
                print(f"   {c:10d} x {len(g):4d}  {c * len(g):11d}  {100 * c * len(g) / executed:5.1f}%  {100 * smp / total:5.1f}%  "
                      + " ".join(f"{o}:{n}" for o, n in ops))
        if a.segments:
            print("   segments (samples from one marker instruction to the next; markers: HGMMA, BAR, DEPBAR, SYNCS, UBLKRED, LDGDEPBAR):")
            mark = re.compile(r"\b(HGMMA|BAR\.|WARPGROUP\.DEPBAR|SYNCS|UBLKRED|LDGDEPBAR|WARPSYNC|EXIT|BRA)")
            seg, start = 0.0, 0
            for i, r in enumerate(rows):
                src = r["Source"].strip()
                if mark.search(src) and i > start:
                    if seg >= total * 0.004:
                        print(f"   {start:5d}-{i - 1:5d} {100 * seg / total:5.2f}%  {rows[start]['Source'].strip()[:60]}")
                    seg, start = 0.0, i
                seg += num(r["Warp Stall Sampling (All Samples)"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
