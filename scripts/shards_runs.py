#!/usr/bin/env python3
"""Measures checkpoints across ranks under MPI and writes docs/data/shards.json,
which scripts/charts.py draws (docs/shards_save_load.svg); prints the
Markdown table of docs/benchmarks.md ("Checkpoints across ranks").

benches/mpi/shards_bench.rs (the example target shards_bench) at 1, 2 and 4
ranks (4 oversubscribed on 2 cores): save_shards against save_on_root (root
0) and load_shards against load_on_all, on a state of MIB MiB in 300 f32
tensors, ROUNDS rounds with the four calls taking turns, medians and spreads
(min-max) kept, peak extra memory per rank, bytes read and written. The
loads read from the page cache unless --cold (drop_caches before each load,
root only; it empties the page cache of the whole machine).

With --zero, the state is a ZeRO one (shards_bench --zero): a third of
the bytes in 100 replicated f32 parameters, two thirds in their Adam
moments @M and @V held sliced; save_shards and load_shards with the sliced
state against the moments gathered whole for save_on_root and made whole
for load_on_all (then cut back to the pieces, all in the time). It writes
docs/data/shards_zero.json (scripts/charts.py --shards-zero draws
docs/shards_zero.svg) and prints that table.

Usage (a quiet machine; Open MPI installed; as root the two
OMPI_ALLOW_RUN_AS_ROOT variables are set here):
    python3 scripts/shards_runs.py [MIB] [ROUNDS] [--cold] [--zero]
"""

import datetime
import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
MIB = int(ARGS[0]) if ARGS else 1024
ROUNDS = int(ARGS[1]) if len(ARGS) > 1 else 5
COLD = "--cold" in sys.argv
ZERO = "--zero" in sys.argv
OUT = ROOT / "docs" / "data" / ("shards_zero.json" if ZERO else "shards.json")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
EXAMPLES = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release" / "examples"
RANKS = [1, 2, 4]
OPS = ["save_shards", "save_on_root", "load_shards", "load_on_all"]


def run(cmd):
    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout


def mpirun(n, *args):
    extra = ["--oversubscribe"] if n > os.cpu_count() else []
    return ["mpirun", "-np", str(n), *extra, *map(str, args)]


def parse(value):
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return value


def fields(line):
    return {k: parse(v) for k, v in re.findall(r"(\w+)=(\S+)", line)}


def shards_bench(n):
    flags = (["--cold"] if COLD else []) + (["--zero"] if ZERO else [])
    cmd = mpirun(n, EXAMPLES / "shards_bench", MIB, ROUNDS, *flags)
    text = run(cmd)
    out = {"ranks": n, "command": " ".join(map(str, cmd)).replace(str(ROOT) + "/", ""), "ops": {}}
    for line in text.splitlines():
        if not line.startswith("shards_bench "):
            continue
        kind = line.split()[1]
        f = fields(line)
        if kind in ("start", "end", "files", "cold"):
            out[kind] = f
        elif "rank" in f:
            out["ops"][f["op"]].setdefault("per_rank", []).append(f)
        else:
            out["ops"][f["op"]] = f
    out["output"] = text
    return out


def commit():
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + ("+changes" if dirty else "")


def main():
    run(["cargo", "build", "--release", "--features", "mpi", "--example", "shards_bench"])
    data = {
        "commit": commit(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "load_average_at_start": os.getloadavg()[0],
        "mib": MIB,
        "mode": "zero" if ZERO else "replicated",
        "rounds": ROUNDS,
        "page_cache": "dropped before each load" if COLD else "warm (the files were just written)",
        "runs": [shards_bench(n) for n in RANKS],
    }
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    if ZERO:
        zero_table(data)
        return
    print(f"shards_bench, {MIB} MiB in 300 f32 tensors, median (min-max) of {ROUNDS} rounds, "
          f"{data['commit']}, {data['date_utc']} UTC, page cache {data['page_cache']}\n")
    print("| ranks | load avg start-end | save_shards | save_on_root | save ratio | with fsync: "
          "save_shards | save_on_root | ratio | load_shards | load_on_all | load ratio | bytes read / "
          "checkpoint (shards / all) | heap peak extra per rank, load_shards (max) | its part + bucket |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def t(op, what="time"):
        return f"{op[what + '_ms_median']:.0f} ms ({op[what + '_ms_min']:.0f}-{op[what + '_ms_max']:.0f})"

    for r in data["runs"]:
        o = r["ops"]
        ss, sr, ls, la = (o[k] for k in OPS)
        heap = max(x["heap_extra_bytes_max"] for x in ls["per_rank"])
        bound = max(x["part_plus_bucket_bytes"] for x in ls["per_rank"])
        print(f"| {r['ranks']} | {r['start']['loadavg'].split(',')[0]}-{r['end']['loadavg'].split(',')[0]} | "
              f"{t(ss)} | {t(sr)} | {sr['time_ms_median'] / ss['time_ms_median']:.2f}x | "
              f"{t(ss, 'with_fsync')} | {t(sr, 'with_fsync')} | "
              f"{sr['with_fsync_ms_median'] / ss['with_fsync_ms_median']:.2f}x | "
              f"{t(ls)} | {t(la)} | {la['time_ms_median'] / ls['time_ms_median']:.2f}x | "
              f"{ls['bytes_all_ranks_over_state']:.3f} / {la['bytes_all_ranks_over_state']:.3f} | "
              f"{heap / 2**20:.1f} MiB | {bound / 2**20:.1f} MiB |")


def zero_table(data):
    """The Markdown table of a --zero run: the sliced calls against the
    moments made whole, time, bytes read and peak extra heap per rank."""
    print(f"shards_bench --zero, {MIB} MiB (a third in 100 f32 parameters, two thirds in their Adam "
          f"moments held sliced), median (min-max) of {ROUNDS} rounds, {data['commit']}, "
          f"{data['date_utc']} UTC, page cache {data['page_cache']}\n")
    print("| ranks | load avg start-end | save_shards | gather + save_on_root | of which gather | save ratio | "
          "with fsync: save_shards | gather + save_on_root | ratio | load_shards | load_on_all + cut | "
          "load ratio | bytes read / state, reported (rchar): sliced / whole | heap peak extra per rank (max): "
          "save_shards | load_shards | gather + save_on_root | load_on_all + cut | its part + bucket (max) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def t(op, what="time"):
        return f"{op[what + '_ms_median']:.0f} ms ({op[what + '_ms_min']:.0f}-{op[what + '_ms_max']:.0f})"

    def heap(op):
        return f"{max(x['heap_extra_bytes_max'] for x in op['per_rank']) / 2**20:.1f} MiB"

    for r in data["runs"]:
        o = r["ops"]
        ss, sr, ls, la = (o[k] for k in OPS)
        state = r["start"]["state_bytes"]
        bound = max(x["part_plus_bucket_bytes"] for x in ls["per_rank"] + ss["per_rank"])
        print(f"| {r['ranks']} | {r['start']['loadavg'].split(',')[0]}-{r['end']['loadavg'].split(',')[0]} | "
              f"{t(ss)} | {t(sr)} | {t(sr, 'gather')} | {sr['time_ms_median'] / ss['time_ms_median']:.2f}x | "
              f"{t(ss, 'with_fsync')} | {t(sr, 'with_fsync')} | "
              f"{sr['with_fsync_ms_median'] / ss['with_fsync_ms_median']:.2f}x | "
              f"{t(ls)} | {t(la)} | {la['time_ms_median'] / ls['time_ms_median']:.2f}x | "
              f"{ls['bytes_all_ranks_over_state']:.3f} ({ls['rchar_all_ranks'] / state:.3f}) / "
              f"{la['bytes_all_ranks_over_state']:.3f} ({la['rchar_all_ranks'] / state:.3f}) | "
              f"{heap(ss)} | {heap(ls)} | {heap(sr)} | {heap(la)} | {bound / 2**20:.1f} MiB |")


if __name__ == "__main__":
    main()
