#!/usr/bin/env python3
"""The cost model of docs/ranks/cost-model.md ("Past this machine"): predicted step
times of data-parallel training over a ring all-reduce, and checkpoint save
and load times on a parallel filesystem (save_shards / load_shards against
save_on_root / load_on_all), for scales the 2-core project machine cannot
run. Prints the Markdown tables of that page.

Usage: python3 scripts/cost_model.py

Every input is below, with where it comes from. MEASURED inputs were measured
on the project machine (commands in docs/ranks/all-reduce.md); ASSUMED inputs are
not measured anywhere in this repository: they are the link parameters the
prediction is asked for, and a per-message latency typical of MPI over such
links. The outputs are predictions, not measurements.
"""

import math

# ----- inputs -------------------------------------------------------------

# MEASURED: train_rnn, 1 process x 1 worker, default flags: 231 000-234 000
# steps/s; one update is 32 sequences x 20 steps = 640 steps.
STEPS_PER_S_ONE = 232_500
SEQ_PER_UPDATE_ONE = 32
SECONDS_PER_SEQUENCE = 640 / STEPS_PER_S_ONE / SEQ_PER_UPDATE_ONE

# MEASURED: train_rnn, `mpirun -np 2 train_rnn --workers 1`: 442 000-447 000
# steps/s, 16 sequences per rank per update.
STEPS_PER_S_TWO = 444_500

# train_rnn's gradients (hidden 64, 10 tokens): Wxh 64x10, Whh 64x64, bh 64,
# Why 10x64, by 10 = 5450 f32.
RNN_GRAD_BYTES = 5450 * 4

# MEASURED before issue 27 (ranks_bench, 2 ranks, quiet runs, every
# variable copied into 25 MiB buckets): SyncPlan::all_reduce 41.9-43.7 ms,
# raw calls in 25 MiB chunks 26.2-27.7 ms, for 100 MB: 0.158 ms per MB.
COPY_S_PER_BYTE_BEFORE = (42.6e-3 - 26.8e-3) / 100e6

# MEASURED at b10503a (ranks_bench --direct-sweep, 2 ranks, 100 MB, 2 MiB
# buckets): every variable fused ("direct off") 43.3 ms against raw calls in
# 2 MiB chunks 37.1 ms: a copied byte costs 0.062 ns. Since issue 27 only
# variables under DIRECT bytes are copied; larger ones are sent from their
# own buffers and swapped with a spare (no copy).
COPY_S_PER_FUSED_BYTE = (43.3e-3 - 37.1e-3) / 100e6
DIRECT = 64 * 2**10

# MEASURED: the consistency digest hashed 0.05-0.09 ms per MB.
DIGEST_S_PER_BYTE = 0.09e-3 / 1e6

# MEASURED (mpi-notes.md, 2 ranks on one host, shared memory): an all-reduce
# of 4 KiB took 8.3 us, of 16 MiB 14.0 ms. With the ring formula at N = 2
# (T = S/B + 2 alpha) that is alpha ~ 4 us and B ~ 1.2 GB/s.
SHM_ALPHA = 4e-6
SHM_BYTES_PER_S = 16 * 2**20 / 14.0e-3

# ASSUMED: the links the issue asks about, and a per-message latency.
LINKS = {"25 Gb/s": 25e9 / 8, "100 Gb/s": 100e9 / 8}
ALPHA = 5e-6

BUCKET = 2 * 2**20          # DEFAULT_BUCKET_BYTES since issue 27
BUCKET_BEFORE = 25 * 2**20  # before
RANKS = [8, 64, 1024]

# ASSUMED: a model's gradients as ranks_bench's, 300 f32 tensors of sizes
# growing as i^2 (the largest about 1 % of the whole), scaled to 1 GB.
TENSORS = 300

# ASSUMED: a parallel filesystem (Lustre, GPFS) for checkpoints across
# ranks, one rank per client node: each client reads or writes at up to
# 2 GB/s, and all clients together at up to 100 GB/s (a large system).
# Not measured here: the project machine has one local disk.
FS_CLIENT = 2e9
FS_AGGREGATE = 100e9
STATES = {"1 GB": 1e9, "100 GB": 100e9}


# ----- the model ----------------------------------------------------------

def ring_all_reduce(nbytes, n, bw, alpha, bucket=BUCKET):
    """2(N-1)/N * bytes / bandwidth + 2(N-1) * latency per call (one call
    per bucket)."""
    calls = max(1, math.ceil(nbytes / bucket))
    return 2 * (n - 1) / n * nbytes / bw + calls * 2 * (n - 1) * alpha


def tensor_sizes(total, count=TENSORS):
    """count tensors of sizes growing as i^2, total bytes in all."""
    weights = [i * i for i in range(1, count + 1)]
    return [total * w / sum(weights) for w in weights]


def layer_calls(sizes, bucket, direct):
    """The all-reduce calls the layer makes: one per bucket-sized chunk of
    each variable of at least `direct` bytes, and the fused buckets of the
    others. Returns (calls, fused bytes)."""
    fused = sum(s for s in sizes if s < direct)
    calls = sum(math.ceil(s / bucket) for s in sizes if s >= direct)
    return calls + math.ceil(fused / bucket), fused


def layer_all_reduce(sizes, n, bw, alpha, bucket, direct):
    """The ring time of the layer's calls, and its copies."""
    calls, fused = layer_calls(sizes, bucket, direct)
    ring = 2 * (n - 1) / n * sum(sizes) / bw + calls * 2 * (n - 1) * alpha
    return ring, fused * COPY_S_PER_FUSED_BYTE, calls


def check(n, alpha):
    """The plan's per-call check: one all-gather of 16 bytes per rank, taken
    as ceil(log2 N) latencies (recursive doubling)."""
    return math.ceil(math.log2(n)) * alpha if n > 1 else 0.0


def rnn_update(n, bw, alpha, seqs_per_rank=16):
    """One train_rnn update with `seqs_per_rank` sequences on each rank."""
    compute = seqs_per_rank * SECONDS_PER_SEQUENCE
    comm = ring_all_reduce(RNN_GRAD_BYTES, n, bw, alpha)
    return compute, comm + check(n, alpha)


def fs_time(nbytes_per_client, clients):
    """`clients` clients each moving `nbytes_per_client` at once: limited by
    a client's bandwidth and by the aggregate."""
    return clients * nbytes_per_client / min(clients * FS_CLIENT, FS_AGGREGATE)


def save_on_root(size, n):
    """One writer: S / b."""
    return fs_time(size, 1)


def save_shards(size, n):
    """N writers of S/N each: S / min(N b, A)."""
    return fs_time(size / n, n)


def load_on_all(size, n):
    """N readers of everything: N S / min(N b, A)."""
    return fs_time(size, n)


def load_shards(size, n, bw, alpha, bucket=BUCKET):
    """N readers of S/N each, S / min(N b, A), then each part broadcast
    from its reader: N broadcasts of S/N bytes, each taken as a
    scatter + all-gather, 2(N-1)/N * (S/N)/B, so 2(N-1)/N * S/B in all,
    plus ceil(log2 N) latencies per bucket call."""
    read = fs_time(size / n, n)
    calls = max(1, math.ceil(size / bucket)) + n
    exchange = 2 * (n - 1) / n * size / bw + calls * math.ceil(math.log2(n)) * alpha
    return read, exchange


def secs(s):
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.1f} s"


def ms(s):
    return f"{s * 1e3:.2f} ms" if s < 0.1 else f"{s * 1e3:.0f} ms"


def main():
    compute, comm = rnn_update(2, SHM_BYTES_PER_S, SHM_ALPHA)
    predicted = 16 * 20 * 2 / (compute + comm)
    print("Calibration, train_rnn at 2 ranks on one host (shared memory):")
    print()
    print("| | steps/s |")
    print("|---|---|")
    print(f"| measured | {STEPS_PER_S_TWO:,.0f} |")
    print(f"| predicted | {predicted:,.0f} |")
    print()

    print("train_rnn, 16 sequences per rank per update (predicted):")
    print()
    print("| ranks | link | compute | all-reduce + check | update | efficiency |")
    print("|---|---|---|---|---|---|")
    for n in RANKS:
        for name, bw in LINKS.items():
            compute, comm = rnn_update(n, bw, ALPHA)
            print(f"| {n} | {name} | {ms(compute)} | {ms(comm)} | "
                  f"{ms(compute + comm)} | {compute / (compute + comm):.0%} |")
    print()

    size = 1e9
    sizes = tensor_sizes(size)
    print("1 GB of f32 gradients in 300 tensors (predicted): before issue 27 "
          "(25 MiB buckets, every byte copied) and now (variables from 64 KiB "
          "sent from their own buffers, the rest fused), at the 2 MiB default "
          "and at 25 MiB buckets:")
    print()
    print("| ranks | link | before: all-reduce + copies | its store's share | "
          "now, 2 MiB: calls | all-reduce | copies + check | store's share | "
          "now, 25 MiB: calls | all-reduce | store's share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in RANKS:
        for name, bw in LINKS.items():
            chk = check(n, ALPHA)
            ar0 = ring_all_reduce(size, n, bw, ALPHA, BUCKET_BEFORE)
            copies0 = size * COPY_S_PER_BYTE_BEFORE
            share0 = (copies0 + chk) / (ar0 + copies0 + chk)
            row = [f"{ms(ar0 + copies0)}", f"{share0:.0%}"]
            for bucket in [BUCKET, BUCKET_BEFORE]:
                ar, copies, calls = layer_all_reduce(sizes, n, bw, ALPHA, bucket, DIRECT)
                share = (copies + chk) / (ar + copies + chk)
                if bucket == BUCKET:
                    row += [f"{calls}", ms(ar), ms(copies + chk), f"{share:.1%}"]
                else:
                    row += [f"{calls}", ms(ar), f"{share:.1%}"]
            print(f"| {n} | {name} | " + " | ".join(row) + " |")
    print()

    print("The bucket from which the per-call latency, 2 (N-1) alpha, falls "
          "under 5 % of a call's bandwidth term, 2 (N-1)/N * bucket / B "
          "(bucket >= 20 N alpha B); raise direct_bytes with it, so that "
          "variables smaller than a bucket share one:")
    print()
    print("| ranks | link | bucket | 1 GB, defaults (2 MiB, direct from 64 KiB): "
          "calls, time | tuned (that bucket, direct from the bucket): calls, time, "
          "of which copies |")
    print("|---|---|---|---|---|")
    for n in RANKS:
        for name, bw in LINKS.items():
            b = max(BUCKET, 20 * n * ALPHA * bw)
            chk = check(n, ALPHA)
            ar, copies, calls = layer_all_reduce(sizes, n, bw, ALPHA, BUCKET, DIRECT)
            tcalls, fused = layer_calls(sizes, b, b)
            tring = 2 * (n - 1) / n * size / bw + tcalls * 2 * (n - 1) * ALPHA
            # Buckets past the caches copy at the cost measured before issue 27.
            tcopies = fused * (COPY_S_PER_FUSED_BYTE if b <= BUCKET else COPY_S_PER_BYTE_BEFORE)
            print(f"| {n} | {name} | {b / 2**20:.0f} MiB | {calls}, {ms(ar + copies + chk)} | "
                  f"{tcalls}, {ms(tring + tcopies + chk)}, {ms(tcopies)} |")
    print()

    print("Where the store's fixed cost per call (the check) falls under 1 % "
          "of the all-reduce's bandwidth term, 2 S / B:")
    print()
    print("| ranks | link | gradient size |")
    print("|---|---|---|")
    for n in RANKS:
        for name, bw in LINKS.items():
            s = 100 * check(n, ALPHA) * bw / 2
            print(f"| {n} | {name} | {s / 1e6:.1f} MB |")
    print()
    print()

    print(f"Checkpoints on a parallel filesystem, one rank per client node, "
          f"{FS_CLIENT / 1e9:.0f} GB/s per client, {FS_AGGREGATE / 1e9:.0f} GB/s in all "
          f"(predicted; load_shards' exchange over the links above):")
    print()
    print("| ranks | state | save_on_root | save_shards | save speed-up | load_on_all | "
          "load_shards, 25 Gb/s | load_shards, 100 Gb/s | load speed-up (100 Gb/s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in RANKS:
        for label, size in STATES.items():
            one, shards = save_on_root(size, n), save_shards(size, n)
            every = load_on_all(size, n)
            loads = [sum(load_shards(size, n, bw, ALPHA)) for bw in LINKS.values()]
            print(f"| {n} | {label} | {secs(one)} | {secs(shards)} | {one / shards:.0f}x | "
                  f"{secs(every)} | {secs(loads[0])} | {secs(loads[1])} | {every / loads[1]:.1f}x |")
    print()
    for name, bw in LINKS.items():
        per_byte_link = 2 / bw
        print(f"{name}: the link moves a byte of gradient in {per_byte_link * 1e9:.2f} ns "
              f"(2/B); a copied byte cost {COPY_S_PER_BYTE_BEFORE * 1e9:.2f} ns before issue 27 "
              f"(25 MiB buckets), {COPY_S_PER_FUSED_BYTE * 1e9:.3f} ns now (2 MiB buckets, "
              f"fused variables only), the digest {DIGEST_S_PER_BYTE * 1e9:.2f} ns.")


if __name__ == "__main__":
    main()
