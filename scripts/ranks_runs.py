#!/usr/bin/env python3
"""Measures the ranks layer under MPI and writes docs/data/ranks.json, which
scripts/charts.py draws (docs/bucket_sweep.svg, docs/ranks_steps.svg); prints
the Markdown tables of docs/benchmarks.md.

- benches/mpi/ranks_bench.rs (the example target ranks_bench) at 2 ranks and at 4 (oversubscribed): the all-reduce
  of a store's gradients (300 f32 tensors, 100 MB) for buckets of 1, 4, 25
  and 100 MiB, against one raw MPI_Allreduce of the same bytes, and the
  consistency digest's cost per MB;
- examples/train_rnn, default flags, one worker per rank: steps/s at 1, 2
  and 4 ranks (and one process with 2 worker threads, for reference),
  ROUNDS rounds with the configurations taking turns, medians kept.

Usage (a quiet machine; Open MPI installed; as root the two
OMPI_ALLOW_RUN_AS_ROOT variables are set here):
    python3 scripts/ranks_runs.py [ROUNDS]
"""

import json
import os
import pathlib
import re
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "data" / "ranks.json"
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
EXAMPLES = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release" / "examples"


def run(cmd):
    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout


def mpirun(n, *args):
    extra = ["--oversubscribe"] if n > os.cpu_count() else []
    return ["mpirun", "-np", str(n), *extra, *map(str, args)]


BUCKET = re.compile(r"buckets of\s+(\d+) MiB \(\s*(\d+) calls\): SyncPlan::all_reduce ([\d.]+) ms; "
                    r"raw MPI in chunks of \d+ MiB ([\d.]+) ms; ratio to one raw call ([\d.]+)x")
RAW = re.compile(r"raw MPI_Allreduce of one flat buffer of (\d+) MB: ([\d.]+) ms")
DIGEST = re.compile(r"digest of (\d+) MB: ([\d.]+) ms local \(([\d.]+) ms/MB\), ([\d.]+) ms with")
STEPS = re.compile(r"final: .*? ([\d.]+) steps/s over")


def ranks_bench(n):
    text = run(mpirun(n, EXAMPLES / "ranks_bench", 100, 9))
    raw = RAW.search(text)
    digest = DIGEST.search(text)
    return {
        "ranks": n,
        "mb": int(raw.group(1)),
        "raw_ms": float(raw.group(2)),
        "buckets": [
            {"mib": int(m[0]), "calls": int(m[1]), "ms": float(m[2]), "raw_chunks_ms": float(m[3]),
             "ratio_to_one_raw_call": float(m[4])}
            for m in BUCKET.findall(text)
        ],
        "digest_ms_per_mb": float(digest.group(3)),
        "check_ms": float(digest.group(4)),
        "output": text,
    }


CONFIGS = {
    "1 rank x 1 worker": lambda: [EXAMPLES / "train_rnn", "--workers", "1"],
    "1 process x 2 workers": lambda: [EXAMPLES / "train_rnn", "--workers", "2"],
    "2 ranks x 1 worker": lambda: mpirun(2, EXAMPLES / "train_rnn", "--workers", "1"),
    "4 ranks x 1 worker": lambda: mpirun(4, EXAMPLES / "train_rnn", "--workers", "1"),
    "2 ranks x 1 worker, --zero": lambda: mpirun(2, EXAMPLES / "train_rnn", "--workers", "1", "--zero"),
    "4 ranks x 1 worker, --zero": lambda: mpirun(4, EXAMPLES / "train_rnn", "--workers", "1", "--zero"),
}
MOMENTS = re.compile(r"optimiser state \(Adam moments\) per rank: ([\d, ]+) bytes")


def main():
    run(["cargo", "build", "--release", "--features", "mpi",
         "--example", "ranks_bench", "--example", "train_rnn"])
    load = os.getloadavg()[0]
    steps = {k: [] for k in CONFIGS}
    moments = {}
    for r in range(ROUNDS):
        names = list(CONFIGS) if r % 2 == 0 else list(reversed(CONFIGS))
        for name in names:
            text = run(CONFIGS[name]())
            steps[name].append(float(STEPS.search(text).group(1)))
            m = MOMENTS.search(text)
            if m:
                moments[name] = [int(x) for x in m.group(1).split(",")]
    benches = [ranks_bench(2), ranks_bench(4)]
    data = {
        "load_average_at_start": load,
        "rounds": ROUNDS,
        "train_rnn_steps_per_s": {k: {"median": statistics.median(v), "runs": v} for k, v in steps.items()},
        "train_rnn_moment_bytes_per_rank": moments,
        "ranks_bench": benches,
    }
    OUT.write_text(json.dumps(data, indent=1) + "\n")

    base = data["train_rnn_steps_per_s"]["1 rank x 1 worker"]["median"]
    print(f"train_rnn, default flags, median of {ROUNDS} rounds (load average {load:.2f} at the start)\n")
    print("| configuration | steps/s (median) | runs | against 1 rank | Adam moments per rank (bytes) |")
    print("|---|---|---|---|---|")
    for k, v in data["train_rnn_steps_per_s"].items():
        runs = ", ".join(f"{x:.0f}" for x in v["runs"])
        mom = ", ".join(map(str, moments.get(k, [])))
        print(f"| {k} | {v['median']:.0f} | {runs} | {v['median'] / base:.2f}x | {mom} |")
    for b in benches:
        print(f"\nranks_bench at {b['ranks']} ranks: {b['mb']} MB in 300 f32 tensors; one raw "
              f"MPI_Allreduce {b['raw_ms']:.1f} ms; digest {b['digest_ms_per_mb']:.3f} ms/MB "
              f"(the whole check {b['check_ms']:.1f} ms)\n")
        print("| bucket | calls | SyncPlan::all_reduce | raw MPI in chunks of the bucket | one raw call / ours |")
        print("|---|---|---|---|---|")
        for x in b["buckets"]:
            print(f"| {x['mib']} MiB | {x['calls']} | {x['ms']:.1f} ms | {x['raw_chunks_ms']:.1f} ms | "
                  f"{x['ratio_to_one_raw_call']:.2f}x |")


if __name__ == "__main__":
    main()
