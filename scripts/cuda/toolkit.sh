#!/usr/bin/env bash
# CUDA 13.0's compiler and libraries from PyPI's wheels, for building the
# `cuda` feature on a machine with no GPU and no CUDA installed.
#
#     source scripts/cuda/toolkit.sh [DIR]
#
# installs the wheels into DIR (default: $SCOPETREE_CUDA_DIR, else
# ~/.cache/scopetree-cuda; kept between runs, skipped when already there),
# adds the lib*.so links the wheels lack, builds a stub libcuda.so.1 (every
# driver call fails with CUDA_ERROR_NO_DEVICE, so programs start and report
# "no CUDA device"), and exports what candle's build needs: CUDA_HOME and
# friends, PATH with nvcc, CUDA_COMPUTE_CAP=90 (H100/H200), the library
# paths. Pinned to 13.0.x: a newer nvcc writes PTX that an r580 driver
# refuses. See docs/gpu.md.
# Sourced: it sets no shell options and leaves no variables of its own
# but the exports; a failed step returns 1.
_st_dir="${1:-${SCOPETREE_CUDA_DIR:-$HOME/.cache/scopetree-cuda}}"
_st_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
C="$_st_dir/nvidia/cu13"
if [ ! -x "$C/bin/nvcc" ] || [ ! -f "$C/lib/libcublas.so.13" ]; then
    echo "== installing CUDA 13.0 wheels into $_st_dir (pip)" >&2
    python3 -m pip install --quiet --no-deps --target "$_st_dir" \
        nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
        nvidia-cuda-cccl==13.0.85 nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvrtc==13.0.88 \
        nvidia-curand==10.4.0.35 nvidia-cublas==13.0.0.19 || return 1
fi
# NCCL for the `nccl` feature (cudarc links libnccl): 2.28.9, the release in
# the GPU machines' PyTorch environment.
# A target of its own: pip skips a package folder (nvidia/) that exists.
_st_n="$_st_dir/nccl/nvidia/nccl/lib/libnccl.so.2"
if [ ! -f "$_st_n" ]; then
    echo "== installing NCCL 2.28.9 (nvidia-nccl-cu13 wheel) into $_st_dir/nccl (pip)" >&2
    python3 -m pip install --quiet --no-deps --target "$_st_dir/nccl" nvidia-nccl-cu13==2.28.9 || return 1
fi
ln -sf "$_st_n" "$C/lib/libnccl.so" || return 1
ln -sf "$_st_n" "$C/lib/libnccl.so.2" || return 1
for _st_l in cublas cublasLt cudart nvrtc curand; do
    _st_f=$(cd "$C/lib" && ls "lib$_st_l.so."* | grep -v alt | head -n 1) || return 1
    ln -sf "$_st_f" "$C/lib/lib$_st_l.so" || return 1
done
ln -sfn lib "$C/lib64" || return 1
mkdir -p "$C/lib/stubs" || return 1
if [ ! -f "$C/lib/stubs/libcuda.so" ] || [ "$_st_here/libcuda_stub.c" -nt "$C/lib/stubs/libcuda.so" ]; then
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$C/lib/stubs/libcuda.so" "$_st_here/libcuda_stub.c" || return 1
fi
ln -sf libcuda.so "$C/lib/stubs/libcuda.so.1" || return 1
export CUDA_HOME="$C" CUDA_PATH="$C" CUDA_ROOT="$C" CUDA_TOOLKIT_ROOT_DIR="$C"
export PATH="$C/bin:$PATH" CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-$(nproc)}"
export LIBRARY_PATH="$C/lib:$C/lib/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$C/lib:$C/lib/stubs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _st_dir _st_here _st_l _st_f _st_n C
