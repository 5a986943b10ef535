#!/usr/bin/env python3
"""Draws the charts of README.md and docs/benchmarks.md with matplotlib, as SVG.

- docs/lookup_depth.svg: lookup time against scope depth, from criterion's
  JSON (target/criterion/**/new/): `find_var_root_hit` of
  `cargo bench --bench lookup` (scopetree's find_var, the Paddle-style scope,
  the index-chase floor) and `peers_full_path` of
  `cargo bench -p scopetree-peers --bench peers` (candle's VarBuilder::get
  of a full name, scopetree's find_var of the same variable).
- docs/bucket_sweep.svg and docs/ranks_steps.svg: from docs/data/ranks.json,
  which scripts/ranks_runs.py writes (MPI runs are not criterion's).
- docs/shards_save_load.svg: from docs/data/shards.json, which
  scripts/shards_runs.py writes.
- docs/shards_zero.svg: from docs/data/shards_zero.json, which
  scripts/shards_runs.py --zero writes.

Usage: pip install matplotlib; python3 scripts/charts.py [criterion_dir]
       python3 scripts/charts.py --ranks   (the two ranks charts only)
       python3 scripts/charts.py --shards  (the two checkpoints-across-ranks charts only)
       python3 scripts/charts.py --shards-zero  (the ZeRO checkpoints chart only)
"""

import json
import pathlib
import sys

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
RANKS_ONLY = sys.argv[1:] == ["--ranks"]
SHARDS_ONLY = sys.argv[1:] == ["--shards"]
ZERO_ONLY = sys.argv[1:] == ["--shards-zero"]
CRIT = (
    pathlib.Path(sys.argv[1])
    if len(sys.argv) > 1 and not (RANKS_ONLY or SHARDS_ONLY or ZERO_ONLY)
    else ROOT / "target" / "criterion"
)
DOCS = ROOT / "docs"
plt.rcParams["svg.hashsalt"] = "scopetree"  # stable ids: the same data give the same file
plt.rcParams["svg.fonttype"] = "none"


def criterion():
    """{group: {function: {depth: median_ns}}}"""
    out = {}
    for bench in CRIT.glob("**/new/benchmark.json"):
        meta = json.loads(bench.read_text())
        est = json.loads((bench.parent / "estimates.json").read_text())
        param = meta.get("value_str")
        if param is None or not param.isdigit():
            continue
        func = meta.get("function_id") or meta["group_id"]
        out.setdefault(meta["group_id"], {}).setdefault(func, {})[int(param)] = est["median"]["point_estimate"]
    return out


def lookup_depth(data):
    series = [
        ("find_var_root_hit", "scopetree_sym", "scopetree find_var (Symbol), hit at the root", "-o"),
        ("find_var_root_hit", "scopetree_str", "scopetree find_var (&str), hit at the root", "-s"),
        ("find_var_root_hit", "paddle_style", "Paddle-style FindVar, hit at the root", "-^"),
        ("find_var_root_hit", "index_chase_floor", "floor: one dependent load per level", ":"),
        ("peers_full_path", "candle_varbuilder_get", "candle VarBuilder::get, full name at depth d", "-d"),
        ("peers_full_path", "scopetree_find_var", "scopetree find_var of that variable, in its own scope (peers run)", "--o"),
    ]
    fig, ax = plt.subplots(figsize=(8, 5))
    drawn = 0
    for group, func, label, style in series:
        pts = data.get(group, {}).get(func)
        if not pts:
            continue
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], style, label=label)
        drawn += 1
    if not drawn:
        print("no lookup data in", CRIT, "- run the lookup and peers benches first")
        plt.close(fig)
        return
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("depth d of the scope the lookup starts from")
    ax.set_ylabel("time per lookup (ns, criterion median)")
    ax.set_title("Variable lookup time against scope depth")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(DOCS / "lookup_depth.svg", metadata={"Date": None})
    plt.close(fig)
    print("wrote docs/lookup_depth.svg")


COLOURS = {("shm", 2): "#1b6ac9", ("shm", 4): "#7fb2ee", ("tcp", 2): "#d1495b", ("tcp", 4): "#f0a35e"}


def bucket_sweep(parts):
    """docs/bucket_sweep.svg: time against bucket size at 2 and 4 ranks, shared memory and TCP over
    loopback (ours, raw MPI in chunks of the bucket, one raw call), and the ratios."""
    runs = [r for p in ("sweep", "tcp") if p in parts for r in parts[p]["runs"]]
    if not runs:
        print("no sweep in docs/data/ranks.json - run scripts/ranks_runs.py --only sweep,tcp first")
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))

    def errs(pts):
        return [[p["median"] - p["min"] for p in pts], [p["max"] - p["median"] for p in pts]]

    for r in runs:
        ax = axes[0] if r["ranks"] == 2 else axes[1]
        colour = COLOURS.get((r["transport"], r["ranks"]), "#444444")
        xs = [x["bucket_bytes"] / 2**20 for x in r["lines"]]
        ours = [x["ms"] for x in r["lines"]]
        chunks = [x["raw_chunks_ms"] for x in r["lines"]]
        ax.errorbar(xs, [p["median"] for p in ours], yerr=errs(ours), fmt="-o", color=colour, capsize=3,
                    label=f"SyncPlan::all_reduce, {r['transport']}")
        ax.errorbar(xs, [p["median"] for p in chunks], yerr=errs(chunks), fmt="--s", color=colour, capsize=3,
                    alpha=0.7, label=f"raw MPI in chunks of the bucket, {r['transport']}")
        ax.axhline(r["raw_whole_ms"]["median"], linestyle=":", color=colour,
                   label=f"one raw MPI_Allreduce of {r['mb']} MB, {r['transport']}")
        for x in r["lines"]:
            if x["default"]:
                ax.axvline(x["bucket_bytes"] / 2**20, color="#888888", linewidth=0.8)
        name = f"{r['transport']}, {r['ranks']} ranks"
        axes[2].plot(xs, [x["ratio_to_one_raw_call"] for x in r["lines"]], "-o", color=colour,
                     label=f"one raw call / ours, {name}")
        axes[2].plot(xs, [x["ratio_to_raw_chunks"] for x in r["lines"]], "--s", color=colour, alpha=0.7,
                     label=f"raw chunks / ours, {name}")
    axes[2].axhline(0.9, color="#444444", linewidth=0.8, linestyle=":", label="goal: 0.9x one raw call")
    mb = runs[0]["mb"]
    ticks = sorted({x["bucket_bytes"] / 2**20 for r in runs for x in r["lines"]})
    for ax, title in [(axes[0], f"2 ranks: all-reduce of {mb} MB in 300 tensors"),
                      (axes[1], f"4 ranks (oversubscribed): {mb} MB in 300 tensors"),
                      (axes[2], "ratios (medians; above 1: ours faster)")]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("bucket size (MiB; grey line: the default)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6.5, loc="best")
    for ax in axes[:2]:
        ax.set_ylabel("time per all-reduce (ms, median; bars min-max)")
        ax.set_ylim(bottom=0)
    axes[2].set_ylabel("ratio of the median times")
    stamps = "; ".join(f"{p}: {parts[p]['rounds']} rounds at {parts[p]['commit']}, load average "
                       f"{parts[p]['load_average_at_start']} at start" for p in ("sweep", "tcp") if p in parts)
    fig.suptitle(f"Bucket sweep, shared memory (shm) and MPI's TCP transport over loopback (tcp); {stamps}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(DOCS / "bucket_sweep.svg", metadata={"Date": None})
    plt.close(fig)
    print("wrote docs/bucket_sweep.svg")


def ranks_charts():
    path = DOCS / "data" / "ranks.json"
    if not path.exists():
        print("no", path, "- run scripts/ranks_runs.py first")
        return
    data = json.loads(path.read_text())
    if data.get("schema") == 2:
        parts = data["parts"]
        bucket_sweep(parts)
        train = parts.get("train")
        steps = train["steps_per_s"] if train else None
    else:  # the first format: no sweep to draw from it any more
        print("docs/data/ranks.json is in the first format - run scripts/ranks_runs.py to redraw bucket_sweep.svg")
        steps = data.get("train_rnn_steps_per_s")
    if not steps:
        print("no train_rnn figures in", path, "- run scripts/ranks_runs.py --only train")
        return
    fig, ax = plt.subplots(figsize=(6.5, 4))
    width = 0.38
    for i, (suffix, label, colour) in enumerate([("", "replicated optimizer state", "#1b6ac9"),
                                                  (", --zero", "partitioned (ZeRO stage 1)", "#0b9a5c")]):
        pts = [(j, n) for j, n in enumerate([1, 2, 4])
               if f"{n} rank{'s' if n > 1 else ''} x 1 worker{suffix}" in steps]
        if not pts:
            continue
        ax.bar([j + (i - 0.5) * width for j, _ in pts],
               [steps[f"{n} rank{'s' if n > 1 else ''} x 1 worker{suffix}"]["median"] for _, n in pts],
               width, label=label, color=colour)
    ax.set_xticks(range(3), ["1", "2", "4"])
    if "1 process x 2 workers" in steps:
        ax.axhline(steps["1 process x 2 workers"]["median"], linestyle="--", color="#d1495b",
                   label="1 process x 2 worker threads")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("ranks (processes under mpirun, 1 worker each; 2 cores)")
    ax.set_ylabel("training steps/s (median)")
    ax.set_title("train_rnn across processes")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(DOCS / "ranks_steps.svg", metadata={"Date": None})
    plt.close(fig)
    print("wrote docs/ranks_steps.svg")


def shards_chart():
    path = DOCS / "data" / "shards.json"
    if not path.exists():
        print("no", path, "- run scripts/shards_runs.py first")
        return
    data = json.loads(path.read_text())
    runs = data["runs"]
    ranks = [r["ranks"] for r in runs]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=False)
    panels = [
        (axes[0], "save", [("save_shards", "time", "save_shards: every rank a shard", "#1b6ac9", "-o"),
                           ("save_shards", "with_fsync", "save_shards, then fsync", "#1b6ac9", "--o"),
                           ("save_on_root", "time", "save_on_root: rank 0 writes all", "#d1495b", "-s"),
                           ("save_on_root", "with_fsync", "save_on_root, then fsync", "#d1495b", "--s")]),
        (axes[1], "load", [("load_shards", "time", "load_shards: every rank reads a share", "#1b6ac9", "-o"),
                           ("load_on_all", "time", "load_on_all: every rank reads all", "#d1495b", "-s")]),
    ]
    for ax, what, series in panels:
        for op, field, label, colour, style in series:
            med = [r["ops"][op][f"{field}_ms_median"] for r in runs]
            lo = [m - r["ops"][op][f"{field}_ms_min"] for m, r in zip(med, runs)]
            hi = [r["ops"][op][f"{field}_ms_max"] - m for m, r in zip(med, runs)]
            ax.errorbar(ranks, med, yerr=[lo, hi], fmt=style, color=colour, capsize=3, label=label)
        ax.set_xticks(ranks, [str(n) for n in ranks])
        ax.set_xlabel("ranks (4 oversubscribed on 2 cores)")
        ax.set_ylabel(f"{what} time (ms, median; bars min-max)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_title(f"Save of {data['mib']} MiB (300 f32 tensors)")
    axes[1].set_title("Load, from the page cache" if data["page_cache"].startswith("warm") else "Load")
    fig.suptitle(f"Checkpoints across ranks, {data['rounds']} rounds at {data['commit']} "
                 f"(load average {data['load_average_at_start']:.1f} at start)", fontsize=9)
    fig.tight_layout()
    fig.savefig(DOCS / "shards_save_load.svg", metadata={"Date": None})
    plt.close(fig)
    print("wrote docs/shards_save_load.svg")


def shards_zero_chart():
    path = DOCS / "data" / "shards_zero.json"
    if not path.exists():
        print("no", path, "- run scripts/shards_runs.py --zero first")
        return
    data = json.loads(path.read_text())
    runs = data["runs"]
    ranks = [r["ranks"] for r in runs]
    sliced, whole = "#1b6ac9", "#d1495b"
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4))

    def series(ax, op, field, label, colour, style):
        med = [r["ops"][op][f"{field}_ms_median"] for r in runs]
        lo = [m - r["ops"][op][f"{field}_ms_min"] for m, r in zip(med, runs)]
        hi = [r["ops"][op][f"{field}_ms_max"] - m for m, r in zip(med, runs)]
        ax.errorbar(ranks, med, yerr=[lo, hi], fmt=style, color=colour, capsize=3, label=label)

    for ax, what, lines in [
        (axes[0], "save", [("save_shards", "time", "save_shards, moments sliced", sliced, "-o"),
                           ("save_shards", "with_fsync", "save_shards, then fsync", sliced, "--o"),
                           ("save_on_root", "time", "gather moments whole + save_on_root + cut", whole, "-s"),
                           ("save_on_root", "with_fsync", "the same, then fsync", whole, "--s"),
                           ("save_on_root", "gather", "of which the gather", whole, ":^")]),
        (axes[1], "load", [("load_shards", "time", "load_shards, moments sliced", sliced, "-o"),
                           ("load_on_all", "time", "whole moments + load_on_all + cut", whole, "-s"),
                           ("load_on_all", "cut", "of which the cut", whole, ":^")]),
    ]:
        for line in lines:
            series(ax, *line)
        ax.set_ylabel(f"{what} time (ms, median; bars min-max)")
    for op, label, colour, style in [("save_shards", "save_shards", sliced, "-o"),
                                     ("load_shards", "load_shards", sliced, "--o"),
                                     ("save_on_root", "gather + save_on_root", whole, "-s"),
                                     ("load_on_all", "load_on_all + cut", whole, "--s")]:
        peak = [max(x["heap_extra_bytes_max"] for x in r["ops"][op]["per_rank"]) / 2**20 for r in runs]
        axes[2].plot(ranks, peak, style, color=colour, label=label)
    bound = [max(x["part_plus_bucket_bytes"] for x in r["ops"]["load_shards"]["per_rank"]
                 + r["ops"]["save_shards"]["per_rank"]) / 2**20 for r in runs]
    axes[2].plot(ranks, bound, ":", color="#444444", label="its part + one bucket (sliced calls)")
    axes[2].set_ylabel("peak extra heap per rank (MiB, the largest rank's max)")
    for ax in axes:
        ax.set_xticks(ranks, [str(n) for n in ranks])
        ax.set_xlabel("ranks (4 oversubscribed on 2 cores)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_title(f"Save of {data['mib']} MiB (1/3 parameters, 2/3 moments)")
    axes[1].set_title("Load, from the page cache" if data["page_cache"].startswith("warm") else "Load")
    axes[2].set_title("Peak extra memory per rank")
    fig.suptitle(f"ZeRO checkpoints across ranks, moments held sliced, {data['rounds']} rounds at "
                 f"{data['commit']} (load average {data['load_average_at_start']:.1f} at start)", fontsize=9)
    fig.tight_layout()
    fig.savefig(DOCS / "shards_zero.svg", metadata={"Date": None})
    plt.close(fig)
    print("wrote docs/shards_zero.svg")


if __name__ == "__main__":
    if not (RANKS_ONLY or SHARDS_ONLY or ZERO_ONLY):
        lookup_depth(criterion())
    if not (SHARDS_ONLY or ZERO_ONLY):
        ranks_charts()
    if not (RANKS_ONLY or ZERO_ONLY):
        shards_chart()
    if not RANKS_ONLY:
        shards_zero_chart()
