# gpuir on an NVIDIA GPU: one CUDA major version throughout, CUDA 13.
#
#   base image  nvidia/cuda:13.0.1-runtime-ubuntu24.04   (CUDA 13.0 runtime, NVRTC)
#   CuPy        cupy-cuda13x                             (the gpu-cuda13 extra)
#   torch       torch==2.13.0 from PyPI                  (its Linux wheel is the CUDA 13 build)
#
# Why CUDA 13 rather than 12: torch 2.13.0's default Linux wheel on PyPI is built
# for CUDA 13 (it depends on nvidia-cublas 13, nvidia-cudnn-cu13, ...), so CUDA 13
# needs no second package index, and every wheel here can be checked against PyPI.
# The host needs an NVIDIA driver that supports CUDA 13 (580 or newer); `gpuir info`
# in the container says "NVIDIA driver too old" when it does not.
#
#   docker build -t gpuir .
#   docker run --rm --gpus all gpuir                          # the demo
#   docker run --rm --gpus all gpuir gpuir info               # which backend, which GPU, or why none
#   docker run --rm --gpus all -v /path/to/data:/data/eval:ro gpuir gpuir eval locomo   # GPUIR_DATA=/data/eval
#   docker compose up                                         # the memory service (docker-compose.yml)
#
# Size: not measured by building (no Docker engine on the development machines).
# Its Python environment, built from the same wheels in a virtualenv, measured
# 5.6 GB (docs/install.md); the image is that plus the CUDA runtime base image.
FROM nvidia/cuda:13.0.1-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Versions come from the pinned base image's Ubuntu release; exact apt pins break
# whenever Ubuntu publishes a security update, so they are deliberately left out.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

WORKDIR /opt/gpuir

# torch first (pinned by constraints.txt to 2.13.0, the CUDA 13 build from PyPI),
# so the layer with the heavy wheels is cached independently of the source.
COPY constraints.txt ./
RUN pip install -c constraints.txt torch==2.13.0

COPY pyproject.toml README.md ./
COPY gpuir ./gpuir
COPY kernels ./kernels
RUN pip install -c constraints.txt '.[gpu-cuda13,dense-torch,service]' \
    && useradd --create-home --uid 10001 gpuir \
    && mkdir -p /data/eval /data/memory \
    && chown -R 10001 /data

ENV GPUIR_KERNEL_DIR=/opt/gpuir/kernels \
    GPUIR_DATA=/data/eval
# Evaluation data (gpuir eval: /data/eval/locomo/locomo10.json, /data/eval/longmemeval/...) and the
# service's memories (/data/memory) live on volumes, never in the image.
VOLUME ["/data"]
USER 10001
WORKDIR /home/gpuir
EXPOSE 8080

CMD ["gpuir", "demo"]
