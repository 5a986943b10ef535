#!/usr/bin/env python3
"""train_rnn's wall time with saves beside training: no saves, a synchronous
distributed save every epoch (--save-dir), --async-save, and the same under
--zero; 2 ranks, 13 MB of state (--hidden 1024), 3 interleaved rounds,
medians (min-max). Build first:
cargo build --release --features mpi --example train_rnn

Usage: python3 scripts/ab_async_saves.py
"""

import os, subprocess, statistics, time, tempfile, shutil
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
B = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "examples", "train_rnn")
base = ["mpirun", "-np", "2", B, "--workers", "1", "--hidden", "1024", "--epochs", "6", "--updates", "4", "--eval-seqs", "8"]
cfgs = {"none": [], "sync": ["--save-dir", "D", "--save-every", "1"], "async": ["--save-dir", "D", "--save-every", "1", "--async-save"],
        "none --zero": ["--zero"], "async --zero": ["--zero", "--save-dir", "D", "--save-every", "1", "--async-save"]}
print("load average at start:", open("/proc/loadavg").read().strip(), flush=True)
res = {k: [] for k in cfgs}
for r in range(3):
    order = list(cfgs) if r % 2 == 0 else list(reversed(cfgs))
    for k in order:
        d = tempfile.mkdtemp()
        args = [a.replace("D", d + "/ck") if a == "D" else a for a in cfgs[k]]
        t = time.time(); out = subprocess.run(base + args, env=ENV, capture_output=True, text=True); dt = time.time() - t
        assert out.returncode == 0, out.stderr
        shutil.rmtree(d)
        res[k].append(dt)
for k, v in res.items():
    m = statistics.median(v)
    print(f"{k}: {m:.2f} s ({min(v):.2f}-{max(v):.2f}); against none: {statistics.median(res['none' if 'zero' not in k else 'none --zero'])/m:.2f}x", flush=True)
