#!/usr/bin/env python3
"""The side-by-side table of the bench scripts, as bench/compare.sh prints it:
one column per server that ran (oxcd, etcd 3.5.16, etcd 3.5.1, etcd 3.4.23),
the median of the rounds in each cell, then the ratio oxcd/3.5.16 (the
reference) and oxcd/3.5.1 when 3.5.1 ran.

    bench/table.py RESULTS 'TITLE|METRIC|UNIT' ...

RESULTS has one figure a line: SERVER METRIC VALUE, SERVER one of oxcd,
etcd3516, etcd35, etcd34 (compare.sh's --only names), VALUE a number or n/a
(the figure could not be measured: shown as n/a, which bench/smoke.sh
refuses). A row whose metric no server recorded is left out; a cell without a
figure is '-'.
"""
import statistics
import sys

SERVERS = [("oxcd", "oxcd"), ("etcd3516", "etcd 3.5.16"), ("etcd35", "etcd 3.5.1"), ("etcd34", "etcd 3.4.23")]


def main():
    path, specs = sys.argv[1], sys.argv[2:]
    values = {}
    for line in open(path):
        server, metric, value = line.split()
        values.setdefault((server, metric), []).append(value)

    def figure(server, metric):
        vals = values.get((server, metric))
        if not vals:
            return None, ""
        nums = [float(v) for v in vals if v != "n/a"]
        return (statistics.median(nums), "") if nums else (None, "n/a")

    def fmt(v, flag):
        if v is None:
            return flag or "-"
        if v == 0:
            return "0"
        if v >= 1000:
            return f"{v:,.0f}"
        return f"{v:.1f}" if v >= 100 else (f"{v:.2f}" if v >= 1 else f"{v:.3f}")

    present = [(key, label) for key, label in SERVERS if any(s == key for s, _ in values)]
    references = [(key, label.split()[-1]) for key, label in present if key in ("etcd3516", "etcd35")]
    header = ["", "unit"] + [label for _, label in present] + [f"oxcd/{v}" for _, v in references]
    table = [header]
    for spec in specs:
        title, metric, unit = spec.split("|")
        if not any((key, metric) in values for key, _ in present):
            continue
        cells = [title, unit] + [fmt(*figure(key, metric)) for key, _ in present]
        ox, _ = figure("oxcd", metric)
        for key, _ in references:
            ref, _ = figure(key, metric)
            cells.append(f"{ox / ref:.2f}x" if ox is not None and ref not in (None, 0) else "-")
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]

    def line(r):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    print(line(table[0]))
    print("  ".join("-" * w for w in widths))
    for r in table[1:]:
        print(line(r))
    rounds = max((len(v) for v in values.values()), default=0)
    print(f"median of {rounds} round(s); n/a = not measured (see stderr)")


if __name__ == "__main__":
    main()
