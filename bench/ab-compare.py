#!/usr/bin/env python3
"""A/B comparison of two pagedattn-bench binaries on a noisy machine.

Runs the two binaries alternately (ABAB..., then BABA.. on odd rounds) on the
same rows and prints each row's mean % of roofline with its standard error,
and the difference. On a shared 2-core VM single runs of one binary spread
over several points within minutes; a difference under about 3 points needs
6-10 rounds to show.

usage: bench/ab-compare.py ROUNDS FILTER[,FILTER...] BENCH_A BENCH_B [THREADS]
e.g.   bench/ab-compare.py 10 16x4096_,8x4096_bs /tmp/old/pagedattn-bench \\
           build/bench/pagedattn-bench
"""

import statistics
import subprocess
import sys


def run_rows(binary, filters, threads):
    """{row name: % of roofline} for one invocation per filter."""
    rows = {}
    for name_filter in filters:
        out = subprocess.run(
            [binary, "--threads", threads, "--no-scalar", "--filter", name_filter, "--csv"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for line in out.splitlines():
            if line.startswith("#") or line.startswith("name,"):
                continue
            fields = line.split(",")
            rows[fields[0].strip('"')] = float(fields[12])  # roof_pct
    return rows


def mean_se(values):
    mean = statistics.mean(values)
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return mean, se


def main():
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    rounds, filters = int(sys.argv[1]), sys.argv[2].split(",")
    binaries, threads = sys.argv[3:5], sys.argv[5] if len(sys.argv) == 6 else "1"
    results = [{}, {}]  # by position: the same binary may be given twice
    for i in range(rounds):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            for row, pct in run_rows(binaries[side], filters, threads).items():
                results[side].setdefault(row, []).append(pct)
    print(f"{rounds} rounds, {threads} thread(s); % of roofline, mean +- standard error")
    for row in results[0]:
        (a, sa), (b, sb) = mean_se(results[0][row]), mean_se(results[1][row])
        print(f"{row:30s} A {a:6.2f} +-{sa:4.2f}   B {b:6.2f} +-{sb:4.2f}   B-A {b - a:+6.2f}")


if __name__ == "__main__":
    main()
