#!/usr/bin/env bash
# Makes a CUDA 13.0 toolkit for building `--features cuda` on a machine without one (this dev VM, CI):
# the pinned NVIDIA wheels from PyPI (nvcc 13.0 must not pull nvvm 13.5, whose PTX the 13.0 driver
# rejects), laid out as a CUDA_HOME, plus link stubs for the libraries cudarc links against, NCCL
# included (the real ones are loaded on the GPU machine at run time; NCCL from the `nvidia-nccl-cu13`
# wheel there). Prints the CUDA_HOME. See ../shared/GPU.md.
#
#   export CUDA_HOME=$(scripts/cuda/setup_toolkit.sh) PATH=$CUDA_HOME/bin:$PATH CUDA_COMPUTE_CAP=90
#   export LIBRARY_PATH=$CUDA_HOME/lib64/stubs:$CUDA_HOME/lib64
#   CARGO_TARGET_DIR=target-cuda cargo build --release --features cuda
set -euo pipefail
root="${PAGEWISE_CUDA_DIR:-$HOME/.cache/pagewise/cuda-13.0}"
home="$root/home"
if [ -x "$home/bin/nvcc" ] && [ -f "$home/lib64/stubs/libnccl.so" ]; then
  echo "$home"
  exit 0
fi
python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$root/wheels" \
  'nvidia-cuda-nvcc==13.0.88' 'nvidia-nvvm==13.0.88' 'nvidia-cuda-crt==13.0.88' \
  'nvidia-cuda-runtime==13.0.96' 'nvidia-cuda-cccl==13.0.85' >&2
cu="$root/wheels/nvidia/cu13"
mkdir -p "$home/lib64/stubs"
for d in bin include nvvm; do ln -sfn "$cu/$d" "$home/$d"; done
ln -sfn lib64 "$home/lib"
cp -f "$cu"/lib/libcudart.so.13* "$home/lib64/"
ln -sfn "$(basename "$(ls "$home"/lib64/libcudart.so.13* | head -n1)")" "$home/lib64/libcudart.so"
[ -f "$cu/lib/libcudart_static.a" ] && cp -f "$cu/lib/libcudart_static.a" "$home/lib64/"

# Link stubs: one empty function per symbol cudarc may reference, under the real SONAME.
find_cudarc() { ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.* 2> /dev/null | head -n1 || true; }
cudarc=$(find_cudarc)
if [ -z "$cudarc" ]; then
  # A fresh machine has no sources yet: fetch them, from this script's checkout.
  (cd "$(dirname "$0")/../.." && cargo fetch --locked >&2)
  cudarc=$(find_cudarc)
fi
if [ -z "$cudarc" ]; then
  echo "cudarc 0.19 sources not found under the cargo registry, even after 'cargo fetch'" >&2
  exit 1
fi
stub() { # stub <cudarc module> <soname> <link name>
  local syms c="$home/lib64/stubs/$3.c"
  syms=$(grep -ho 'load::<_F>("[A-Za-z0-9_]*")' "$cudarc/src/$1"/sys/*.rs | sed 's/.*("\(.*\)")/\1/' | sort -u)
  printf 'void %s(void) {}\n' $syms > "$c"
  gcc -shared -fPIC -Wl,-soname,"$2" -o "$home/lib64/stubs/$2" "$c"
  ln -sfn "$2" "$home/lib64/stubs/$3.so"
}
stub driver libcuda.so.1 libcuda
stub nvrtc libnvrtc.so.13 libnvrtc
stub cublas libcublas.so.13 libcublas
stub cublaslt libcublasLt.so.13 libcublasLt
stub curand libcurand.so.10 libcurand
stub nccl libnccl.so.2 libnccl
echo "$home"
