#!/bin/sh
# Install torch 2.13.0 (what the `dense` extra pins) into PYTHON's environment,
# the right build for this machine, and say which and why.
#
#   sh scripts/install_torch.sh [PYTHON]        (make setup runs it with .venv/bin/python)
#
# * An NVIDIA driver is present (nvidia-smi works, or /proc/driver/nvidia exists):
#   torch==2.13.0 from PyPI, whose Linux wheel is the CUDA 13 build (it pulls
#   about 3 GB of nvidia-* wheels; that is what a GPU machine needs).
# * No NVIDIA driver: a CPU build. From the PyTorch CPU index
#   (https://download.pytorch.org/whl/cpu, about 190 MB) when it can be reached;
#   else from the configured package indexes, which give a CPU build only when
#   one is available locally (e.g. a torch-2.13.0+cpu wheel under PIP_FIND_LINKS):
#   a pip dry run tells which before anything is installed.
# * GPUIR_TORCH_INDEX=URL overrides the choice (e.g. https://download.pytorch.org/whl/cu126
#   for a CUDA 12 driver, or a local mirror); GPUIR_TORCH_INDEX=pypi forces the PyPI wheel.
set -eu
PY=${1:-python3}
VERSION=2.13.0
CPU_INDEX=https://download.pytorch.org/whl/cpu
say() { echo "install_torch: $*"; }

have=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
case "$have" in
    "$VERSION"|"$VERSION"+*) say "torch $have is already installed; nothing to do"; exit 0 ;;
esac

if [ -n "${GPUIR_TORCH_INDEX:-}" ]; then
    if [ "$GPUIR_TORCH_INDEX" = pypi ]; then
        say "GPUIR_TORCH_INDEX=pypi: torch==$VERSION from the configured indexes"
        "$PY" -m pip install --quiet "torch==$VERSION"
    else
        say "GPUIR_TORCH_INDEX is set: torch==$VERSION from $GPUIR_TORCH_INDEX"
        "$PY" -m pip install --quiet --index-url "$GPUIR_TORCH_INDEX" "torch==$VERSION"
    fi
elif { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; } || [ -e /proc/driver/nvidia/version ]; then
    say "an NVIDIA driver is present: torch==$VERSION from PyPI, the CUDA 13 build (about 3 GB with its nvidia-* wheels)"
    "$PY" -m pip install --quiet "torch==$VERSION"
else
    say "no NVIDIA driver here (no working nvidia-smi, no /proc/driver/nvidia): installing a CPU build of torch"
    if "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=8)' \
            "$CPU_INDEX" >/dev/null 2>&1; then
        say "the PyTorch CPU index is reachable: torch==$VERSION from $CPU_INDEX (about 190 MB)"
        "$PY" -m pip install --quiet --index-url "$CPU_INDEX" "torch==$VERSION"
    else
        say "$CPU_INDEX cannot be reached: falling back to torch==$VERSION from the configured indexes"
        plan=$("$PY" -m pip install --dry-run --quiet --report - "torch==$VERSION" 2>/dev/null | "$PY" -c '
import json, sys
items = json.load(sys.stdin).get("install", [])
torch = [i["metadata"]["version"] for i in items if i["metadata"]["name"].lower() == "torch"]
cuda = [i["metadata"]["name"] for i in items if i["metadata"]["name"].lower().startswith(("nvidia-", "triton"))]
print(torch[0] if torch else "?", len(cuda))' 2>/dev/null || echo "? ?")
        set -- $plan
        case "$1" in
            *+cpu) say "pip resolves torch $1, a CPU build (a local wheel): no CUDA libraries" ;;
            *) say "WARNING: pip resolves torch $1 with $2 CUDA packages: the CUDA 13 build, about 3 GB;" \
                   "it runs on the CPU too. To avoid it, make download.pytorch.org reachable or set" \
                   "GPUIR_TORCH_INDEX to an index that has torch $VERSION+cpu" ;;
        esac
        "$PY" -m pip install --quiet "torch==$VERSION"
    fi
fi
"$PY" -W ignore -c 'import torch; print("install_torch: installed torch", torch.__version__, "(CUDA build: " + str(torch.version.cuda) + ")")' 2>/dev/null
