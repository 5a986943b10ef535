#!/usr/bin/env python3
"""Turn criterion's output into the tables of docs/benchmarks.md.

Reads every target/criterion/**/new/{benchmark,estimates}.json (the medians of
the last run of each benchmark) and prints one Markdown table per group with
the ratios the brief asks for. The charts are drawn by scripts/charts.py
(matplotlib).

Usage: python3 scripts/bench_report.py [criterion_dir] [--baseline NAME] > tables.md

With --baseline NAME it reads the run saved by criterion's
`--save-baseline NAME` (target/criterion/**/NAME/) instead of the last run.
"""

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARGS = sys.argv[1:]
BASELINE = None
if "--baseline" in ARGS:
    i = ARGS.index("--baseline")
    BASELINE = ARGS[i + 1]
    del ARGS[i:i + 2]
CRIT = pathlib.Path(ARGS[0]) if ARGS else ROOT / "target" / "criterion"


def load():
    """{group: {function: {param: median_ns}}}"""
    out = {}
    for bench in CRIT.glob(f"**/{BASELINE or 'new'}/benchmark.json"):
        meta = json.loads(bench.read_text())
        est = json.loads((bench.parent / "estimates.json").read_text())
        group = meta["group_id"]
        func = meta.get("function_id") or meta["group_id"]
        param = meta.get("value_str") or "-"
        out.setdefault(group, {}).setdefault(func, {})[param] = est["median"]["point_estimate"]
    return out


def fmt(ns):
    if ns is None:
        return "–"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.1f} ns" if ns < 100 else f"{ns:.0f} ns"


def key(p):
    return (0, int(p)) if p.isdigit() else (1, p)


# Ratio columns per group: (title, numerator function, denominator function).
RATIOS = {
    "find_var_root_hit": [
        ("paddle / scopetree (str)", "paddle_style", "scopetree_str"),
        ("paddle / scopetree (sym)", "paddle_style", "scopetree_sym"),
        ("find_var / resolver (sym)", "scopetree_sym", "resolver_sym"),
    ],
    "find_var_local_hit": [
        ("paddle / scopetree (str)", "paddle_style", "scopetree_str"),
        ("find_var / resolver (sym)", "scopetree_sym", "resolver_sym"),
    ],
    "find_var_miss": [
        ("paddle / scopetree (str)", "paddle_style", "scopetree_str"),
        ("find_var / resolver (sym)", "scopetree_sym", "resolver_sym"),
    ],
    "full_path_walk": [
        ("str: 17 kids / 1 kid", "scopetree_walk_str_kids17", "scopetree_walk_str_kids1"),
        ("sym: 17 kids / 1 kid", "scopetree_walk_sym_kids17", "scopetree_walk_sym_kids1"),
    ],
    "find_var_width": [
        ("paddle / scopetree, local (str)", "paddle_style_local", "scopetree_str_local"),
        ("paddle / scopetree, root (str)", "paddle_style_root", "scopetree_str_root"),
    ],
    "peers_full_path": [
        ("candle get / scopetree find_var", "candle_varbuilder_get", "scopetree_find_var"),
        ("candle contains / scopetree find_var", "candle_contains_tensor", "scopetree_find_var"),
        ("paddle / scopetree, root hit", "paddle_style_root_hit", "scopetree_root_hit"),
        ("candle get / scopetree path walk (str)", "candle_varbuilder_get", "scopetree_path_walk"),
        ("candle get / scopetree path walk (sym)", "candle_varbuilder_get", "scopetree_path_walk_sym"),
    ],
}

# Groups whose benchmarks pair up by name rather than by parameter.
PAIRS = {
    "handle_read": [
        ("read one", "scopetree_get_one", "vec_floor_get_one"),
        ("read 1024 (sweep)", "scopetree_get_sweep_1024", "vec_floor_get_sweep_1024"),
        ("overwrite one", "scopetree_set", "vec_floor_set"),
    ],
    "step_churn": [
        ("structural, names as symbols", "scopetree_structural_sym", "paddle_style_structural"),
        ("structural, names as &str", "scopetree_structural_str", "paddle_style_structural"),
        ("with values", "scopetree_values_sym", "paddle_style_values"),
    ],
    "wide_parent_10k": [
        ("delete one kid, create one", "scopetree_delete_recreate", "paddle_style_delete_recreate"),
    ],
    "tree_100k_scopes_1m_vars": [
        ("build", "scopetree_build", "paddle_style_build"),
        ("teardown", "scopetree_teardown", "paddle_style_teardown"),
    ],
}
PAIR_HEADS = {
    "handle_read": ("scopetree", "Vec floor", "scopetree / floor"),
    "step_churn": ("scopetree", "Paddle-style", "Paddle-style / scopetree"),
    "wide_parent_10k": ("scopetree", "Paddle-style", "Paddle-style / scopetree"),
    "tree_100k_scopes_1m_vars": ("scopetree", "Paddle-style", "Paddle-style / scopetree"),
}


def pivot(group, funcs):
    names = list(funcs)
    params = sorted({p for f in funcs.values() for p in f}, key=key)
    ratios = RATIOS.get(group, [])
    per_level = group.startswith("find_var_root_hit")
    head = ["param"] + names + [r[0] for r in ratios]
    if per_level:
        head.append("scopetree (sym) per level")
    lines = [f"#### `{group}`", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for p in params:
        row = [p] + [fmt(funcs[n].get(p)) for n in names]
        for _, num, den in ratios:
            a, b = funcs.get(num, {}).get(p), funcs.get(den, {}).get(p)
            row.append(f"{a / b:.1f}×" if a and b else "–")
        if per_level:
            row.append(f"{funcs['scopetree_sym'][p] / (int(p) + 1):.2f} ns")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def pairs(group, funcs):
    a_head, b_head, r_head = PAIR_HEADS[group]
    lines = [f"#### `{group}`", "", f"| case | {a_head} | {b_head} | {r_head} |", "|---|---|---|---|"]
    for title, a, b in PAIRS[group]:
        x, y = funcs.get(a, {}).get("-"), funcs.get(b, {}).get("-")
        if group == "handle_read":
            r = f"{x / y:.2f}×" if x and y else "–"
        else:
            r = f"{y / x:.1f}×" if x and y else "–"
        lines.append(f"| {title} | {fmt(x)} | {fmt(y)} | {r} |")
    return lines


def main():
    data = load()
    order = ["find_var_root_hit", "find_var_local_hit", "find_var_miss", "find_var_width",
             "full_path_walk", "peers_full_path", "handle_read", "step_churn", "wide_parent_10k",
             "tree_100k_scopes_1m_vars"]
    for g in order + sorted(set(data) - set(order)):
        if g not in data:
            continue
        lines = pairs(g, data[g]) if g in PAIRS else pivot(g, data[g])
        print("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
