# gpuir on an NVIDIA GPU: CUDA 12 runtime, gpuir[gpu,dense], `gpuir demo` by default.
#
#   docker build -t gpuir .
#   docker run --rm --gpus all gpuir                 # the demo
#   docker run --rm --gpus all gpuir gpuir info      # which backend, which GPU
#
# The runtime image is enough: kernels are compiled at first use by NVRTC, which
# the nvidia-cuda-nvrtc-cu12 wheel (in the gpu extra) provides.
FROM nvidia/cuda:12.6.3-runtime-ubuntu22.04

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

# The constraints first (torch pinned to 2.13.0, CUDA 12 build), so the layer
# with the heavy wheels is cached independently of the source.
COPY constraints.txt ./
RUN pip install -c constraints.txt torch==2.13.0

COPY pyproject.toml README.md ./
COPY gpuir ./gpuir
COPY kernels ./kernels
RUN pip install -c constraints.txt '.[gpu,dense]' \
    && useradd --create-home --uid 1000 gpuir

ENV GPUIR_KERNEL_DIR=/opt/gpuir/kernels
USER 1000
WORKDIR /home/gpuir

CMD ["gpuir", "demo"]
