#!/usr/bin/env python3
"""Measures the ranks layer under MPI and writes docs/data/ranks.json, which
scripts/charts.py --ranks draws (docs/bucket_sweep.svg, docs/ranks_steps.svg);
prints the Markdown tables of docs/benchmarks.md.

The parts (all by default; --only picks some, comma-separated):

- sweep: benches/mpi/ranks_bench.rs (the example target ranks_bench) at 2
  ranks and at 4 (oversubscribed on 2 cores), over shared memory (mpirun
  --mca pml ob1 --mca btl self,vader: what Open MPI 4.1 picks on one host
  here, named so that no other transport stands in): SyncPlan::all_reduce of a
  store's gradients (300 f32 tensors, MB megabytes) for buckets of 1, 2, 4,
  8, 16, 25, 50 and 100 MiB, against raw MPI_Allreduce in chunks of each
  bucket's size over the same bytes and against one raw MPI_Allreduce of
  the whole; the consistency digest's cost per MB and the watchdog's cost;
- tcp: the same sweep with MPI's TCP transport over loopback instead of
  shared memory (mpirun --mca pml ob1 --mca btl tcp,self
  --mca btl_tcp_if_include lo; without the last, Open MPI leaves 127.0.0.1
  out and connects the ranks through another interface's address), at 2
  and 4 ranks;
- direct: ranks_bench --direct-sweep at 2 ranks: at the default bucket,
  variables of at least 16 KiB ... 4 MiB sent from their own buffers, or
  none (off), against the same raw calls;
- candle: benches/mpi/candle_bench.rs at 2 ranks: CandlePlan::all_reduce
  and CandlePlan::all_reduce_in_place
  of a CandleStore's gradients (the same 300 tensors) against the same raw
  calls;
- zero: ranks_bench --zero at 2 ranks and at 4 (oversubscribed), over
  shared memory as the sweep: the ZeRO stage-1 exchange of the same
  gradients, SyncPlan::reduce_scatter (sum) then SyncPlan::all_gather, of a
  plan with the default options and of one with direct_bytes(usize::MAX)
  (direct off: everything through the padded buffers), against raw
  MPI_Reduce_scatter_block and MPI_Allgather over one flat buffer of the
  same bytes; the whole exchange and each half;
- train: examples/train_rnn, default flags, one worker per rank: steps/s at
  1, 2 and 4 ranks (and one process with 2 worker threads, for reference),
  with and without --zero, TRAIN_ROUNDS rounds with the configurations
  taking turns, medians kept.

The benches time every configuration once per round, in a new order each
round, ROUNDS rounds after a warm-up; each figure is kept as its median and
range (min-max), with the load average at the start of each run. Parts not
run keep what docs/data/ranks.json held for them.

Usage (a quiet machine; Open MPI installed; as root the two
OMPI_ALLOW_RUN_AS_ROOT variables are set here):
    python3 scripts/ranks_runs.py [--only sweep,tcp,direct,candle,zero,train]
        [--rounds ROUNDS] [--train-rounds TRAIN_ROUNDS] [--mb MB] [--out PATH]
ROUNDS: bench rounds (9); TRAIN_ROUNDS: train_rnn rounds (3); MB: the
gradients' size (100; a small one for a smoke run); PATH: where the data go
(docs/data/ranks.json; give another for a smoke run).
"""

import argparse
import datetime
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
EXAMPLES = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release" / "examples"
PARTS = ["sweep", "tcp", "direct", "candle", "zero", "train"]
TRANSPORTS = {
    "shm": ["--mca", "pml", "ob1", "--mca", "btl", "self,vader"],
    "tcp": ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"],
}


def run(cmd):
    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout


def mpirun(n, *args, transport="shm"):
    extra = ["--oversubscribe"] if n > os.cpu_count() else []
    return ["mpirun", "-np", str(n), *extra, *TRANSPORTS[transport], *map(str, args)]


def commit():
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True)
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


SIZE = r"[\d.]+ [KM]iB|off"
SPREAD = r"([\d.]+) ms \(([\d.]+)–([\d.]+)\)"
LINE = re.compile(
    rf"^(?P<label>buckets of\s+(?:{SIZE})|direct (?:from (?:{SIZE})|off)|bucket of (?:{SIZE}))\s*"
    rf"\(\s*(?P<calls>\d+) calls\): (?P<name>\S+) {SPREAD}; raw MPI in chunks of (?P<chunk>{SIZE}) {SPREAD}; "
    r"ratio to one raw call ([\d.]+)x, to raw chunks ([\d.]+)x "
    r"\(rounds: ([\d.]+)–([\d.]+)x, ([\d.]+)–([\d.]+)x\)(?P<default>; default)?$",
    re.M)
WHOLE = re.compile(rf"raw MPI_Allreduce of one flat buffer of (\d+) MB: {SPREAD} \(([\d.]+) GB/s\)")
LOAD = re.compile(r"load average at start: (.*)")
DIGEST = re.compile(r"digest of (\d+) MB: ([\d.]+) ms local \(([\d.]+) ms/MB\), ([\d.]+) ms with the check's "
                    r"all-gathers; ranges ([\d.]+)–([\d.]+) ms, ([\d.]+)–([\d.]+) ms")
WATCHDOG = re.compile(r"of 1 MB: ([\d.]+) µs with the watchdog .*?, ([\d.]+) µs without a timeout "
                      r"\(([+-][\d.]+) %\)")
ZERO_HEAD = re.compile(r"gradients: \d+ f32 tensors, (\d+) MB; (ZeRO exchange, [^;]+);")
ZERO_LINE = re.compile(
    rf"^(?P<label>reduce-scatter \+ all-gather|reduce-scatter|all-gather): SyncPlan {SPREAD}; "
    rf"direct off {SPREAD}; raw MPI over one flat buffer {SPREAD}; "
    r"ratio to raw ([\d.]+)x, direct off to raw ([\d.]+)x \(rounds: ([\d.]+)–([\d.]+)x, ([\d.]+)–([\d.]+)x\)$",
    re.M)
ZERO_HALVES = {"reduce-scatter + all-gather": "exchange", "reduce-scatter": "reduce_scatter",
               "all-gather": "all_gather"}
STEPS = re.compile(r"final: .*? ([\d.]+) steps/s over")
MOMENTS = re.compile(r"optimiser state \(Adam moments\) per rank: ([\d, ]+) bytes")


def size_bytes(label):
    """'16 KiB' -> 16384; 'off' -> None."""
    if label == "off":
        return None
    value, unit = label.split()
    return round(float(value) * {"KiB": 1 << 10, "MiB": 1 << 20}[unit])


def spread(median, lo, hi):
    return {"median": float(median), "min": float(lo), "max": float(hi)}


def parse_bench(text, cmd, ranks, transport):
    """What one ranks_bench or candle_bench run printed, as data."""
    whole = WHOLE.search(text)
    out = {
        "ranks": ranks,
        "transport": transport,
        "command": " ".join(map(str, cmd)),
        "load_average_at_start": LOAD.search(text).group(1),
        "mb": int(whole.group(1)),
        "raw_whole_ms": spread(*whole.group(2, 3, 4)),
        "raw_whole_gb_per_s": float(whole.group(5)),
        "lines": [],
        "output": text,
    }
    for m in LINE.finditer(text):
        g = m.groups()
        label = m.group("label")
        line = {
            "label": re.sub(r"\s+", " ", label),
            "calls": int(m.group("calls")),
            "name": m.group("name"),
            "ms": spread(*g[3:6]),
            "chunk_bytes": size_bytes(m.group("chunk")),
            "raw_chunks_ms": spread(*g[7:10]),
            "ratio_to_one_raw_call": float(g[10]),
            "ratio_to_raw_chunks": float(g[11]),
            "ratio_to_one_raw_call_per_round": [float(g[12]), float(g[13])],
            "ratio_to_raw_chunks_per_round": [float(g[14]), float(g[15])],
            "default": m.group("default") is not None,
        }
        if label.startswith("direct"):
            line["direct_bytes"] = size_bytes(label.removeprefix("direct").strip().removeprefix("from").strip())
        else:
            line["bucket_bytes"] = size_bytes(label.split(" of ")[1].strip())
        out["lines"].append(line)
    digest = DIGEST.search(text)
    if digest:
        out["digest_ms_per_mb"] = float(digest.group(3))
        out["digest_local_ms"] = spread(digest.group(2), *digest.group(5, 6))
        out["check_ms"] = spread(digest.group(4), *digest.group(7, 8))
    watchdog = WATCHDOG.search(text)
    if watchdog:
        out["watchdog_us"] = {"with": float(watchdog.group(1)), "without": float(watchdog.group(2)),
                              "cost_percent": float(watchdog.group(3))}
    if not out["lines"]:
        sys.exit(f"no result lines in the output of {out['command']}:\n{text}")
    return out


def parse_zero(text, cmd, ranks, transport):
    """What one ranks_bench --zero run printed, as data: per half (exchange,
    reduce_scatter, all_gather) the three configurations' times and the
    ratios raw / SyncPlan and raw / direct off."""
    head = ZERO_HEAD.search(text)
    out = {
        "ranks": ranks,
        "transport": transport,
        "command": " ".join(map(str, cmd)),
        "load_average_at_start": LOAD.search(text).group(1),
        "mb": int(head.group(1)),
        "mode": head.group(2),
        "halves": {},
        "output": text,
    }
    for m in ZERO_LINE.finditer(text):
        g = m.groups()
        out["halves"][ZERO_HALVES[m.group("label")]] = {
            "syncplan_ms": spread(*g[1:4]),
            "direct_off_ms": spread(*g[4:7]),
            "raw_ms": spread(*g[7:10]),
            "raw_over_syncplan": float(g[10]),
            "raw_over_direct_off": float(g[11]),
            "raw_over_syncplan_per_round": [float(g[12]), float(g[13])],
            "raw_over_direct_off_per_round": [float(g[14]), float(g[15])],
        }
    if sorted(out["halves"]) != sorted(ZERO_HALVES.values()):
        sys.exit(f"missing result lines in the output of {out['command']}:\n{text}")
    return out


def bench(example, ranks, args, transport="shm", parse=parse_bench):
    cmd = mpirun(ranks, EXAMPLES / example, *args, transport=transport)
    record = [c.removeprefix(f"{ROOT}/") for c in cmd]  # paths in the repository, relative
    print("running", " ".join(map(str, record)), file=sys.stderr, flush=True)
    return parse(run(cmd), record, ranks, transport)


TRAIN = {
    "1 rank x 1 worker": lambda: [EXAMPLES / "train_rnn", "--workers", "1"],
    "1 process x 2 workers": lambda: [EXAMPLES / "train_rnn", "--workers", "2"],
    "2 ranks x 1 worker": lambda: mpirun(2, EXAMPLES / "train_rnn", "--workers", "1"),
    "4 ranks x 1 worker": lambda: mpirun(4, EXAMPLES / "train_rnn", "--workers", "1"),
    "2 ranks x 1 worker, --zero": lambda: mpirun(2, EXAMPLES / "train_rnn", "--workers", "1", "--zero"),
    "4 ranks x 1 worker, --zero": lambda: mpirun(4, EXAMPLES / "train_rnn", "--workers", "1", "--zero"),
}


def train(rounds):
    steps = {k: [] for k in TRAIN}
    moments = {}
    for r in range(rounds):
        names = list(TRAIN) if r % 2 == 0 else list(reversed(TRAIN))
        for name in names:
            print("running train_rnn:", name, file=sys.stderr, flush=True)
            text = run(TRAIN[name]())
            steps[name].append(float(STEPS.search(text).group(1)))
            m = MOMENTS.search(text)
            if m:
                moments[name] = [int(x) for x in m.group(1).split(",")]
    return {
        "steps_per_s": {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}
                        for k, v in steps.items()},
        "moment_bytes_per_rank": moments,
    }


def previous(path):
    """The parts the data file held (its train part, from the first format, too)."""
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    if old.get("schema") == 2:
        return old["parts"]
    if "train_rnn_steps_per_s" in old:
        return {"train": {"commit": None, "rounds": old.get("rounds"),
                          "load_average_at_start": str(old.get("load_average_at_start")),
                          "steps_per_s": old["train_rnn_steps_per_s"],
                          "moment_bytes_per_rank": old.get("train_rnn_moment_bytes_per_rank", {})}}
    return {}


def cell(s):
    return f"{s['median']:.1f} ms ({s['min']:.1f}–{s['max']:.1f})"


def ratios(x):
    a, b = x["ratio_to_one_raw_call_per_round"], x["ratio_to_raw_chunks_per_round"]
    return (f"{x['ratio_to_one_raw_call']:.2f}x ({a[0]:.2f}–{a[1]:.2f})",
            f"{x['ratio_to_raw_chunks']:.2f}x ({b[0]:.2f}–{b[1]:.2f})")


def about(part):
    return (f"commit {part.get('commit')}, {part.get('date', '?')}, median (min–max) of "
            f"{part.get('rounds')} rounds")


def print_sweeps(parts):
    sweeps = [r for p in ("sweep", "tcp") if p in parts for r in parts[p]["runs"]]
    for n in sorted({r["ranks"] for r in sweeps}):
        runs = [r for r in sweeps if r["ranks"] == n]
        names = [r["transport"] for r in runs]
        print(f"\nSyncPlan::all_reduce of 300 f32 tensors at {n} ranks"
              f"{' (oversubscribed)' if n > 2 else ''}; ratios: one raw call / ours, raw chunks / ours "
              f"(ranges: of the ratios within each round); the default bucket in bold")
        for r in runs:
            part = parts["sweep" if r["transport"] == "shm" else "tcp"]
            print(f"- {r['transport']}: {r['mb']} MB; one raw MPI_Allreduce {cell(r['raw_whole_ms'])}; load average "
                  f"{r['load_average_at_start']} at start; {about(part)}; `{r['command']}`")
        print()
        head = " | ".join(f"{t}: ours | {t}: raw chunks | {t}: one raw call / ours | {t}: raw chunks / ours"
                          for t in names)
        print(f"| bucket | calls | {head} |")
        print("|---|---|" + "---|" * (4 * len(runs)))
        for x in runs[0]["lines"]:
            mib = x["bucket_bytes"] / 2**20
            label = f"{mib:g} MiB"
            if x["default"]:
                label = f"**{label}**"
            cols = []
            for r in runs:
                y = next((y for y in r["lines"] if y["bucket_bytes"] == x["bucket_bytes"]), None)
                cols += [cell(y["ms"]), cell(y["raw_chunks_ms"]), *ratios(y)] if y else ["-"] * 4
            print(f"| {label} | {x['calls']} | {' | '.join(cols)} |")
    for r in parts.get("sweep", {}).get("runs", []):
        if "digest_ms_per_mb" in r:
            w = r.get("watchdog_us", {})
            print(f"\nAt {r['ranks']} ranks (shm): digest {r['digest_ms_per_mb']:.3f} ms/MB, the whole "
                  f"check {cell(r['check_ms'])}; watchdog {w.get('with')} µs against {w.get('without')} µs "
                  f"per 1 MB all-reduce ({w.get('cost_percent'):+.2f} %)")


def print_lines(title, part, first):
    for r in part["runs"]:
        print(f"\n{title} at {r['ranks']} ranks, {r['mb']} MB; one raw MPI_Allreduce {cell(r['raw_whole_ms'])}; "
              f"load average {r['load_average_at_start']} at start; {about(part)}; `{r['command']}`\n")
        chunk = r["lines"][0]["chunk_bytes"]
        print(f"| {first} (the default in bold) | calls | {r['lines'][0]['name']} | raw MPI in chunks of "
              f"{chunk / 2**20:g} MiB | one raw call / ours | raw chunks / ours |")
        print("|---|---|---|---|---|---|")
        for x in r["lines"]:
            label = x["label"].removeprefix("direct ").removeprefix("from ").removeprefix("bucket of ")
            if x["default"]:
                label = f"**{label}**"
            if x["name"] != r["lines"][0]["name"]:
                label = f"{label}, {x['name']}"
            print(f"| {label} | {x['calls']} | {cell(x['ms'])} | {cell(x['raw_chunks_ms'])} | "
                  f"{' | '.join(ratios(x))} |")


def print_zero(part):
    runs = part["runs"]
    print(f"\nThe ZeRO exchange (ranks_bench --zero): SyncPlan::reduce_scatter (sum) then all_gather; "
          f"{about(part)}; ratios raw / ours (ranges: of the ratios within each round)")
    for r in runs:
        print(f"- {r['ranks']} ranks{' (oversubscribed)' if r['ranks'] > 2 else ''}: {r['mb']} MB; {r['mode']}; "
              f"load average {r['load_average_at_start']} at start; `{r['command']}`")
    print()
    head = " | ".join(f"{r['ranks']} ranks: {c}" for r in runs
                      for c in ("SyncPlan", "direct off", "raw", "raw / SyncPlan", "raw / direct off"))
    print(f"| part | {head} |")
    print("|---|" + "---|" * (5 * len(runs)))
    for key in ZERO_HALVES.values():
        cols = []
        for r in runs:
            x = r["halves"][key]
            a, b = x["raw_over_syncplan_per_round"], x["raw_over_direct_off_per_round"]
            cols += [cell(x["syncplan_ms"]), cell(x["direct_off_ms"]), cell(x["raw_ms"]),
                     f"{x['raw_over_syncplan']:.2f}x ({a[0]:.2f}–{a[1]:.2f})",
                     f"{x['raw_over_direct_off']:.2f}x ({b[0]:.2f}–{b[1]:.2f})"]
        print(f"| {key.replace('_', '-')} | {' | '.join(cols)} |")


def print_train(part):
    steps = part["steps_per_s"]
    base = steps["1 rank x 1 worker"]["median"]
    print(f"\ntrain_rnn, default flags, median of {part['rounds']} rounds (load average "
          f"{part['load_average_at_start']} at the start; commit {part.get('commit')})\n")
    print("| configuration | steps/s (median) | runs | against 1 rank | Adam moments per rank (bytes) |")
    print("|---|---|---|---|---|")
    for k, v in steps.items():
        runs = ", ".join(f"{x:.0f}" for x in v["runs"])
        mom = ", ".join(map(str, part["moment_bytes_per_rank"].get(k, [])))
        print(f"| {k} | {v['median']:.0f} | {runs} | {v['median'] / base:.2f}x | {mom} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(PARTS), help="comma-separated parts: " + ",".join(PARTS))
    ap.add_argument("--rounds", type=int, default=9, help="bench rounds after a warm-up (9)")
    ap.add_argument("--train-rounds", type=int, default=3, help="train_rnn rounds (3)")
    ap.add_argument("--mb", type=int, default=100, help="the gradients' size in MB (100)")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "data" / "ranks.json")
    args = ap.parse_args()
    only = [p for p in args.only.split(",") if p]
    unknown = set(only) - set(PARTS)
    if unknown:
        sys.exit(f"unknown parts {sorted(unknown)}; the parts are {PARTS}")

    if set(only) & {"sweep", "tcp", "direct", "zero", "train"}:
        run(["cargo", "build", "--release", "--features", "mpi",
             "--example", "ranks_bench", "--example", "train_rnn"])
    if "candle" in only:
        run(["cargo", "build", "--release", "--features", "candle,mpi", "--example", "candle_bench"])
    parts = previous(args.out)
    bench_args = [args.mb, args.rounds]

    def stamp(part, rounds):
        part.update(commit=commit(), date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    rounds=rounds, load_average_at_start=" ".join(f"{x:.2f}" for x in os.getloadavg()))
        return part

    # shm and tcp take turns at each size of world.
    runs = {"sweep": [], "tcp": []}
    stamps = {p: stamp({}, args.rounds) for p in ("sweep", "tcp") if p in only}
    for n in (2, 4):
        for part, transport in (("sweep", "shm"), ("tcp", "tcp")):
            if part in only:
                runs[part].append(bench("ranks_bench", n, bench_args, transport))
    for part in ("sweep", "tcp"):
        if part in only:
            parts[part] = dict(stamps[part], runs=runs[part])
    if "direct" in only:
        part = stamp({}, args.rounds)
        parts["direct"] = dict(part, runs=[bench("ranks_bench", 2, [*bench_args, "--direct-sweep"])])
    if "candle" in only:
        part = stamp({}, args.rounds)
        parts["candle"] = dict(part, runs=[bench("candle_bench", 2, bench_args)])
    if "zero" in only:
        part = stamp({}, args.rounds)
        parts["zero"] = dict(part, runs=[bench("ranks_bench", n, [*bench_args, "--zero"], parse=parse_zero)
                                         for n in (2, 4)])
    if "train" in only:
        part = stamp({}, args.train_rounds)
        parts["train"] = dict(part, **train(args.train_rounds))

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"schema": 2, "parts": parts}, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)

    if "train" in parts:
        print_train(parts["train"])
    print_sweeps(parts)
    if "direct" in parts:
        print_lines("The direct threshold (ranks_bench --direct-sweep), at the default bucket,", parts["direct"],
                    "direct from")
    if "candle" in parts:
        print_lines("CandlePlan::all_reduce (candle_bench)", parts["candle"], "bucket")
    if "zero" in parts:
        print_zero(parts["zero"])


if __name__ == "__main__":
    main()
