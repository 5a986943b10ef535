#!/usr/bin/env python3
"""Draws docs/layers.svg, the picture that opens docs/design.md: the crate's
layers as bands, bottom (arena) to top (ranks), each listing its files, and
the import arrows between layers, counted from the code by scripts/layers.py.
A layer with rooms (layers.ROOMS: the ranks layer's sub-folders) lists its
files one room per row, in the rooms' order, the lowest room at the bottom.

Usage: python3 -m pip install matplotlib; python3 scripts/layers_chart.py
(redraw after moving, adding or splitting files under src/).
"""
import pathlib
import sys

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import layers  # noqa: E402

plt.rcParams["svg.hashsalt"] = "scopetree"  # stable ids: the same code gives the same file
plt.rcParams["svg.fonttype"] = "none"

COLS, BOX_W, ROW_H, PAD, GAP = 5, 1.3, 0.42, 0.16, 0.14  # inches
LABEL_X, FILES_X, BUS_X, BUS_DX, WIDTH = 0.1, 1.8, 8.55, 0.34, 10.6
COLORS = ["#dbe9f6", "#dff0d8", "#fcf0d4", "#f3e0ef", "#e4e0f5", "#fde2d6"]
FONT = 9.5


def boxes(ms, files, strip):
    """Where a layer's file boxes go: ([(row, column, label, module)],
    [(row, room label)], rows). A layer with rooms starts each room on a row
    of its own, top room first, its files named inside the room; a file in
    no room (the layer's mod.rs, or an unplaced one) goes on a first row."""
    ms = sorted(ms, key=files.get)
    top = ms[0][0] if ms else None
    if top not in layers.ROOMS:
        return ([(k // COLS, k % COLS, files[m].split("/", 2)[2] if strip else files[m][len("src/"):], m)
                 for k, m in enumerate(ms)], [], max(1, -(-len(ms) // COLS)))
    rooms = layers.ROOMS[top]
    groups = [("no room", [m for m in ms if layers.room_of(m) is None])]
    for i in reversed(range(len(rooms))):
        groups.append((rooms[i][0], [m for m in ms if layers.room_of(m) == i]))
    out, labels, row = [], [], 0
    for name, group in groups:
        if not group:
            continue
        if name == "no room" and all(files[m] == f"src/{top}/mod.rs" for m in group):
            name = "facade"
        paths = [files[m].split("/")[2:] for m in group]  # the path inside src/<top>/
        labels.append((row, name + ("/" if any(len(p) > 1 for p in paths) else "")))
        for k, (m, path) in enumerate(zip(group, paths)):
            out.append((row + k // COLS, k % COLS, "/".join(path[1:] or path), m))
        row += -(-len(group) // COLS)
    return out, labels, row


def main():
    files, arrows = layers.read_crate(ROOT)
    in_circle = {m for comp in layers.circles(list(files), arrows) for m in comp}
    names = [name for name, _ in layers.LAYERS]
    members = [[m for m in files if m and layers.layer_of(m) == i] for i in range(len(names))]
    unplaced = [m for m in files if m and layers.layer_of(m) is None]
    if unplaced:
        names.append("unplaced (error)")
        members.append(unplaced)
    count = {}
    for a, b in arrows:
        la, lb = layers.layer_of(a), layers.layer_of(b)
        if a and b:  # lib.rs, the crate root, is left out
            la, lb = (len(names) - 1 if x is None else x for x in (la, lb))
            count[la, lb] = count.get((la, lb), 0) + 1

    # Bands, bottom to top: y of each band's bottom and top.
    titles = [name.replace(" and ", " and\n") for name in names]
    dirs_of = [sorted({files[m].split("/")[1] + ("/" if len(m) > 1 or files[m].endswith("mod.rs") else "")
                       for m in ms}) for ms in members]
    grids = [boxes(ms, files, len(dirs) == 1 and dirs[0].endswith("/")) for ms, dirs in zip(members, dirs_of)]
    spans, skips, y = [], [], 0.72  # below: the caption, three lines
    for title, (_, labels, rows) in zip(titles, grids):
        label_h = 0.75 + 0.22 * title.count("\n")  # the layer's name, then three lines
        skips.append(label_h if labels else 0)  # rooms' rows start below the layer's name
        spans.append((y, y + max(2 * PAD + skips[-1] + rows * ROW_H, label_h + 0.2)))
        y = spans[-1][1] + GAP
    height = y + 0.45
    fig = plt.figure(figsize=(WIDTH, height))
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, WIDTH)
    ax.set_ylim(0, height)
    ax.axis("off")

    for i, (name, title, ms) in enumerate(zip(names, titles, members)):
        lo, hi = spans[i]
        bad = name.startswith("unplaced")
        ax.add_patch(FancyBboxPatch((0.05, lo), BUS_X - 0.35, hi - lo, boxstyle="round,pad=0,rounding_size=0.08",
                                    fc="#eeeeee" if bad else COLORS[i % len(COLORS)], ec="#888888", lw=0.8))
        dirs = dirs_of[i]
        where = "src/" + dirs[0] if len(dirs) == 1 else "src/*.rs, " + ", ".join(d for d in dirs if d.endswith("/"))
        inside = count.get((i, i), 0)
        ax.text(LABEL_X, hi - 0.14, title, fontsize=FONT + 1.5, weight="bold", va="top",
                color="#b00000" if bad else "black", linespacing=1.1)
        n_files = f"{len(ms)} file" + ("s" if len(ms) != 1 else "")
        ax.text(LABEL_X, hi - 0.42 - 0.22 * title.count("\n"), f"{where}\n{n_files}, {inside} arrows\ninside the layer",
                fontsize=FONT - 1.5, va="top", color="#444444", linespacing=1.25)
        cells, labels, _ = grids[i]
        for row, label in labels:
            ax.text(LABEL_X + 0.1, hi - PAD - skips[i] - (row + 0.5) * ROW_H, label, fontsize=FONT,
                    weight="bold", family="monospace", va="center", color="#444444")
        for row, column, label, m in cells:
            x = FILES_X + column * BOX_W
            yy = hi - PAD - skips[i] - (row + 0.5) * ROW_H
            red = m in in_circle
            ax.text(x + BOX_W / 2 - 0.06, yy, label, fontsize=FONT, ha="center", va="center",
                    family="monospace", color="#b00000" if red else "black",
                    bbox=dict(boxstyle="round,pad=0.25", fc="white", ec="#b00000" if red else "#999999",
                              lw=1.4 if red else 0.6))

    # One column per importing layer: it starts at the layer (a dot) and each
    # number on it counts the file-to-file arrows that land in the layer at
    # that height. A column going up is an upward import: red.
    mid = [(lo + hi) / 2 for lo, hi in spans]
    col = 0
    for src in reversed(range(len(names))):
        targets = sorted(t for (s, t) in count if s == src and t != src)
        if not targets:
            continue
        x = BUS_X + col * BUS_DX
        col += 1
        for ends, red in (([t for t in targets if t < src], False), ([t for t in targets if t > src], True)):
            if not ends:
                continue
            far = min(ends) if not red else max(ends)
            color = "#b00000" if red else "#333333"
            ax.annotate("", xy=(x, mid[far] + (0.2 if not red else -0.2)), xytext=(x, mid[src]),
                        arrowprops=dict(arrowstyle="-|>", color=color, lw=1.2, shrinkA=0, shrinkB=0))
            for t in ends:
                ax.text(x, mid[t], str(count[src, t]), fontsize=FONT - 0.5, ha="center", va="center",
                        color=color, bbox=dict(boxstyle="round,pad=0.2", fc="white", ec=color, lw=0.8))
        ax.plot([x], [mid[src]], "o", color="#333333", ms=5)
        ax.plot([BUS_X - 0.3, x], [mid[src], mid[src]], color="#333333", lw=0.8, ls=":")

    n_circles = len(layers.circles(list(files), arrows))
    ax.text(0.05, height - 0.14, "scopetree's layers, from the code (scripts/layers_chart.py): "
            "a layer may import only the layers below it", fontsize=FONT + 1, weight="bold", va="top")
    ax.text(0.05, 0.59, f"Columns on the right: the arrows leaving one layer (dot); a number counts the "
            f"file-to-file imports landing\nin the layer at its height. Red: an upward import, or a file "
            f"in a module circle ({n_circles} today). lib.rs, the crate root, is left out.\nA layer with rooms "
            f"({', '.join(layers.ROOMS)}) lists its files one room per row, the lowest room at the bottom; "
            f"layers.py checks the rooms' order too.",
            fontsize=FONT - 1, va="top", color="#444444", linespacing=1.3)
    out = ROOT / "docs" / "layers.svg"
    fig.savefig(out, metadata={"Date": None})
    print(f"wrote {out.relative_to(ROOT)}: {len(files) - 1} files in {len(names)} layers, "
          f"{sum(count.values())} arrows")


if __name__ == "__main__":
    main()
