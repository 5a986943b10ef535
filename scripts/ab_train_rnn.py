#!/usr/bin/env python3
"""train_rnn's steps/s of two builds side by side: 1, 2 and 4 ranks, with and
without --zero, ROUNDS rounds with the builds and configurations taking
turns, medians (min-max). Build the old one from a worktree of its commit
(touch src/lib.rs before building each: both share one target directory).

Usage: python3 scripts/ab_train_rnn.py OLD_BINARY NEW_BINARY [ROUNDS]
"""

import os, re, subprocess, statistics, sys
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
STEPS = re.compile(r"([\d.]+) steps/s over")
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
cfgs = {
 "1 rank": lambda b: [b, "--workers", "1"],
 "2 ranks": lambda b: ["mpirun", "-np", "2", b, "--workers", "1"],
 "4 ranks": lambda b: ["mpirun", "-np", "4", "--oversubscribe", b, "--workers", "1"],
 "2 ranks --zero": lambda b: ["mpirun", "-np", "2", b, "--workers", "1", "--zero"],
 "4 ranks --zero": lambda b: ["mpirun", "-np", "4", "--oversubscribe", b, "--workers", "1", "--zero"],
}
bins = {"old": sys.argv[1], "new": sys.argv[2]}
print("load average at start:", open("/proc/loadavg").read().strip())
res = {(c, b): [] for c in cfgs for b in bins}
for r in range(rounds):
    order = [(c, b) for c in cfgs for b in bins]
    if r % 2: order.reverse()
    for c, b in order:
        out = subprocess.run(cfgs[c](bins[b]), env=ENV, capture_output=True, text=True).stdout
        res[(c, b)].append(float(STEPS.search(out).group(1)))
base = {b: statistics.median(res[("1 rank", b)]) for b in bins}
for c in cfgs:
    row = []
    for b in bins:
        v = res[(c, b)]
        m = statistics.median(v)
        row.append(f"{b}: {m:,.0f} ({min(v):,.0f}-{max(v):,.0f}) {m/base[b]:.2f}x")
    print(f"| {c} | " + " | ".join(row) + f" | new/old {statistics.median(res[(c,'new')])/statistics.median(res[(c,'old')]):.2f} |")
