#!/usr/bin/env bash
# Fetches NVIDIA's CUDA 12.9 / 13.0 driver headers and nvml.h (from the PyPI wheels
# nvidia-cuda-runtime-cu12, nvidia-cuda-runtime and nvidia-nvml-dev-cu12), and CUDA 13.0's PTX
# assembler (from nvidia-cuda-nvcc) into DEST:
#   DEST/cuda-12.9/include  DEST/cuda-13.0/include  DEST/nvml/include  DEST/cuda-13.0/bin/ptxas
# The abi-check tests read them from $CUSLICE_CUDA_HEADERS (default: target/cuda-headers).
# Usage: tests/abi-check/fetch-headers.sh DEST
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 DEST" >&2
    exit 2
fi
dest=$1

if [ -f "$dest/cuda-12.9/include/cuda.h" ] && [ -f "$dest/cuda-12.9/include/cudaTypedefs.h" ] \
    && [ -f "$dest/cuda-13.0/include/cuda.h" ] && [ -f "$dest/cuda-13.0/include/cudaTypedefs.h" ] \
    && [ -f "$dest/nvml/include/nvml.h" ] && [ -x "$dest/cuda-13.0/bin/ptxas" ]; then
    echo "NVIDIA headers already present in $dest"
    exit 0
fi

mkdir -p "$dest/wheels"
if ! python3 -m pip download --no-deps --quiet -d "$dest/wheels" \
    nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-runtime==13.0.96 nvidia-nvml-dev-cu12==12.9.79 \
    nvidia-cuda-nvcc==13.0.88 \
    >"$dest/wheels/pip.log" 2>&1; then
    echo "fetch-headers: 'python3 -m pip download' of the NVIDIA wheels failed (see $dest/wheels/pip.log)" >&2
    exit 1
fi

# extract WHEEL_GLOB PREFIX_IN_WHEEL OUT: copies every file under PREFIX_IN_WHEEL of the one
# wheel matching WHEEL_GLOB into the directory OUT, keeping the layout below the prefix; a
# prefix that names one file is copied to the file OUT.
extract() {
    local wheel
    wheel=$(compgen -G "$dest/wheels/$1" | head -n 1 || true)
    if [ -z "$wheel" ]; then
        echo "fetch-headers: no wheel matching $1 in $dest/wheels" >&2
        exit 1
    fi
    python3 - "$wheel" "$2" "$3" <<'PY'
import os, sys, zipfile
wheel, prefix, out = sys.argv[1:]
count = 0
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if not name.startswith(prefix) or name.endswith("/"):
            continue
        rel = name[len(prefix):]
        target = os.path.join(out, rel) if rel else out  # a prefix naming one file: OUT is it
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(name) as src, open(target, "wb") as dst:
            dst.write(src.read())
        count += 1
if count == 0:
    sys.exit(f"fetch-headers: {wheel} has no files under {prefix}")
PY
}

extract 'nvidia_cuda_runtime_cu12-12.9.79-*.whl' nvidia/cuda_runtime/include/ "$dest/cuda-12.9/include"
extract 'nvidia_cuda_runtime-13.0.96-*.whl' nvidia/cu13/include/ "$dest/cuda-13.0/include"
extract 'nvidia_nvml_dev_cu12-12.9.79-*.whl' nvidia/nvml_dev/include/ "$dest/nvml/include"
extract 'nvidia_cuda_nvcc-13.0.88-*.whl' nvidia/cu13/bin/ptxas "$dest/cuda-13.0/bin/ptxas"
chmod +x "$dest/cuda-13.0/bin/ptxas"

for f in cuda-12.9/include/cuda.h cuda-12.9/include/cudaTypedefs.h \
    cuda-13.0/include/cuda.h cuda-13.0/include/cudaTypedefs.h nvml/include/nvml.h cuda-13.0/bin/ptxas; do
    if [ ! -f "$dest/$f" ]; then
        echo "fetch-headers: $dest/$f missing after extraction" >&2
        exit 1
    fi
done
echo "NVIDIA headers fetched into $dest"
