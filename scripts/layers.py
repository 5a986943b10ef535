#!/usr/bin/env python3
"""Checks the crate's module graph: no circle of files, no layer importing a layer above it.

    python3 scripts/layers.py [CRATE_DIR]      exit 0 when clean, 1 otherwise

An arrow A -> B means file A names an item defined in file B through a
`crate::`, `super::` or `self::` path, a child module's name or an imported
module, in a `use` line or inline in the code. Not arrows: `mod`
declarations, code in `#[cfg(test)] mod` blocks, names of A's own module or
its ancestors (lib.rs is everyone's), and a module's `pub use` of its own
children (a facade). A path through a `use` elsewhere (`crate::arena::ScopeId`,
re-exported by arena/mod.rs) leads to the defining file (arena/keys.rs).

It fails on:
- a circle (a strongly connected component of files), printed with each
  arrow inside it and the names that tie it;
- an upward import: a lower layer naming a higher layer's item (LAYERS:
  arena < tree and its helpers < sharing < checkpoint < candle < burn < ranks);
- an upward import between the rooms of a layer that has them (ROOMS: the
  ranks layer's sub-folders, error < transport < vars < layout < plan <
  checkpoints < candle < nccl); an order also rules out a circle between rooms;
- a file in no layer: a new top-level module must be added to LAYERS; a
  file in no room of a layer that has rooms (src/ranks/new.rs, or a new
  sub-folder) must be added to that layer's ROOMS.

It reads the text, not the compiler's resolution: a macro or a glob
re-export may hide an arrow. A maintained tool (cargo-modules) resolves paths
exactly but builds rust-analyzer's crates: many minutes of `cargo install`
on CI's 2 cores. Python 3.11 standard library only.
"""
import pathlib
import re
import sys

# Bottom to top. A top-level module (src/NAME.rs or src/NAME/) belongs to the
# layer that lists it; lib.rs, the crate root, belongs to none and is exempt.
LAYERS = [
    ("arena", ["arena"]),
    ("tree and its helpers", ["layer_api", "tree", "vars", "lookup", "value", "traverse", "dump", "names",
                              "error", "short", "entry", "resolver", "diagnostics", "step", "workers",
                              "threads"]),
    ("sharing", ["sharing"]),
    ("checkpoint", ["checkpoint"]),
    ("candle", ["candle"]),
    ("burn", ["burn"]),
    ("ranks", ["ranks"]),
]
LAYER = {top: i for i, (_, tops) in enumerate(LAYERS) for top in tops}

# Rooms inside a layer, bottom to top, as LAYERS: a module of src/ranks/
# (src/ranks/NAME.rs or src/ranks/NAME/) belongs to the room that lists it;
# src/ranks/mod.rs, the layer's facade, belongs to none and is exempt.
ROOMS = {
    "ranks": [
        ("error", ["error"]),
        ("transport", ["transport"]),
        ("vars", ["vars"]),
        ("layout", ["layout"]),
        ("plan", ["plan"]),
        ("checkpoints", ["checkpoints"]),
        ("candle", ["candle"]),
        ("nccl", ["nccl"]),
    ],
}
ROOM = {(top, sub): i for top, rooms in ROOMS.items() for i, (_, subs) in enumerate(rooms) for sub in subs}

# Comments, strings and char literals, blanked before reading paths.
NOISE = re.compile(r"//[^\n]*|/\*.*?\*/|(?<!\w)r(#*)\".*?\"\1|\"(?:\\.|[^\"\\])*\"|'(?:\\.[^']*|[^'\\])'", re.S)
TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{")
USE = re.compile(r"\b(pub(?:\([\w: ]+\))?\s+)?use\s+([^;]+);")
INLINE = re.compile(r"(?<![\w:])(\w+(?:\s*::\s*\w+)+)")


def layer_of(mod):
    """Index into LAYERS of a module path (a tuple); None for lib.rs and unplaced files."""
    return LAYER.get(mod[0]) if mod else None


def room_of(mod):
    """Index into ROOMS[top] of a module path under a layer with rooms; None
    for the layer's mod.rs, unplaced files and modules of layers without rooms."""
    return ROOM.get(mod[:2]) if len(mod) > 1 and mod[0] in ROOMS else None


def room_name(mod):
    """`ranks/plan`: the layer's top-level module and the room's name."""
    return f"{mod[0]}/{ROOMS[mod[0]][room_of(mod)][0]}"


def clean(text):
    """The code without comments, strings and `#[cfg(test)] mod { ... }` blocks."""
    text = NOISE.sub(" ", text)
    while m := TEST_MOD.search(text):
        depth, j = 1, m.end()
        while depth and j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        text = text[: m.start()] + text[j:]
    return text


def use_paths(tree):
    """`a::{b, c::{self, d as e}}` -> ['a::b', 'a::c', 'a::c::d as e'], with a work list."""
    out, work = [], [("", re.sub(r"\s+", " ", tree).strip())]
    while work:
        prefix, body = work.pop()
        i = body.find("{")
        if i < 0:
            out.append(prefix + body)
            continue
        head, inner, depth, part = prefix + body[:i], body[i + 1 : body.rindex("}")], 0, ""
        for ch in inner + ",":
            if ch == "," and depth == 0:
                part = part.strip()
                if part == "self":
                    out.append(head.rstrip(":"))
                elif part:
                    work.append((head, part))
                part = ""
            else:
                depth += {"{": 1, "}": -1}.get(ch, 0)
                part += ch
    return out


def read_crate(root="."):
    """(files, arrows): files maps each module path (a tuple) to its file, relative
    to root; arrows maps (from module, to module) to the names that tie them."""
    root = pathlib.Path(root)
    files = {}
    for path in sorted((root / "src").rglob("*.rs")):
        parts = path.relative_to(root / "src").with_suffix("").parts
        files[parts[:-1] if parts[-1] in ("mod", "lib", "main") else parts] = str(path.relative_to(root))
    text = {mod: clean((root / f).read_text(encoding="utf-8")) for mod, f in files.items()}

    def walk(segs, here, aliases):
        """A path seen from module `here` -> (deepest module it names, the segments after it), or None."""
        if segs[0] == "crate":
            base, segs = (), segs[1:]
        elif segs[0] in ("self", "super"):
            base = here
            while segs and segs[0] in ("self", "super"):
                base, segs = (base[:-1] if segs[0] == "super" else base), segs[1:]
        elif here + (segs[0],) in files:
            base = here
        elif segs[0] in aliases:
            base, segs = aliases[segs[0]], segs[1:]
        else:
            return None  # another crate, a local name, an associated item
        while segs and base + (segs[0],) in files:
            base, segs = base + (segs[0],), segs[1:]
        return base, segs

    # Every module's `use` lines: (name bound, (module, rest of the path), public?).
    uses = {mod: [] for mod in files}
    for mod, code in text.items():
        for m in USE.finditer(code):
            for p in use_paths(m.group(2)):
                path, _, alias = p.partition(" as ")
                segs = [s for s in path.replace(" ", "").split("::") if s]
                if segs and (hit := walk(segs, mod, {})):
                    uses[mod].append((alias.strip() or segs[-1], hit, bool(m.group(1))))
    modules = {m: {a: t for a, (t, rest), _ in u if not rest} for m, u in uses.items()}
    items = {m: {a: (t, rest[0]) for a, (t, rest), _ in u if rest} for m, u in uses.items()}

    def definer(mod, name):
        """Follow `use` lines from (module, name) to the module that defines the name."""
        seen = set()
        while name in items[mod] and (mod, name) not in seen:
            seen.add((mod, name))
            mod, name = items[mod][name]
        return mod, name

    arrows = {}
    for mod, code in text.items():
        found = [(t, rest, pub) for _, (t, rest), pub in uses[mod]]
        for m in INLINE.finditer(USE.sub(";", code)):
            if hit := walk(m.group(1).replace(" ", "").split("::"), mod, modules[mod]):
                found.append((*hit, False))
        for target, rest, pub in found:
            if not rest or rest[0] == "*":
                continue  # a module imported (its inline paths count) or a glob
            target, name = definer(target, rest[0])
            if pub and target[: len(mod)] == mod:
                continue  # a facade: a module re-exporting its own children
            if mod[: len(target)] != target:  # not its own module nor an ancestor
                arrows.setdefault((mod, target), set()).add(name)
    return files, arrows


def circles(nodes, arrows):
    """Strongly connected components of more than one node (Kosaraju, iterative)."""
    succ, pred = {n: [] for n in nodes}, {n: [] for n in nodes}
    for a, b in arrows:
        succ[a].append(b)
        pred[b].append(a)
    order, seen = [], set()
    for start in nodes:  # pass 1: every node, in the order its depth-first visit ends
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(succ[start]))]
        while stack:
            for w in stack[-1][1]:
                if w not in seen:
                    seen.add(w)
                    stack.append((w, iter(succ[w])))
                    break
            else:
                order.append(stack.pop()[0])
    comps, placed = [], set()
    for start in reversed(order):  # pass 2: along reversed arrows, last ended first
        if start in placed:
            continue
        comp, stack = [], [start]
        placed.add(start)
        while stack:
            comp.append(node := stack.pop())
            for w in pred[node]:
                if w not in placed:
                    placed.add(w)
                    stack.append(w)
        if len(comp) > 1:
            comps.append(comp)
    return comps


def main():
    files, arrows = read_crate(sys.argv[1] if len(sys.argv) > 1 else ".")
    ties = lambda a, b: ", ".join(sorted(arrows[a, b]))
    found = sorted(sorted(c, key=files.get) for c in circles(list(files), arrows))
    for n, comp in enumerate(found, 1):
        print(f"circle {n}: {len(comp)} files: {', '.join(files[m] for m in comp)}")
        for a in comp:
            for b in comp:
                if (a, b) in arrows:
                    print(f"  {files[a]} -> {files[b]}: {ties(a, b)}")
    upward = [(a, b) for a, b in sorted(arrows, key=lambda e: (files[e[0]], files[e[1]]))
              if None not in (layer_of(a), layer_of(b)) and layer_of(a) < layer_of(b)]
    for a, b in upward:
        print(f"upward import: {files[a]} ({LAYERS[layer_of(a)][0]}) -> {files[b]} "
              f"({LAYERS[layer_of(b)][0]}): {ties(a, b)}")
    inner = [(a, b) for a, b in sorted(arrows, key=lambda e: (files[e[0]], files[e[1]]))
             if a and b and a[0] == b[0] and None not in (room_of(a), room_of(b)) and room_of(a) < room_of(b)]
    for a, b in inner:
        print(f"upward import: {files[a]} ({room_name(a)}) -> {files[b]} ({room_name(b)}): {ties(a, b)}")
    upward += inner
    unplaced = sorted(files[m] for m in files if m and layer_of(m) is None)
    for f in unplaced:
        print(f"unplaced file: {f}: add its top-level module to LAYERS in scripts/layers.py")
    homeless = sorted(files[m] for m in files if len(m) > 1 and m[0] in ROOMS and room_of(m) is None)
    for f in homeless:
        print(f"unplaced file: {f}: add its module under src/{f.split('/')[1]}/ to ROOMS in scripts/layers.py")
    unplaced += homeless
    bad = len(found) + len(upward) + len(unplaced)
    print(f"layers.py: {len(found)} circle(s), {len(upward)} upward import(s), {len(unplaced)} unplaced "
          f"file(s) among {len(files)} files under src/: {'FAIL' if bad else 'ok'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
