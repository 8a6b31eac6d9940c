# BluTrain image: the build stage installs with scripts/install-deps and compiles
# `blutrain` with scripts/build (Release here): the same two scripts CI runs
# through scripts/test. The runtime stage carries only the binary, its shared
# libraries (scripts/install-deps --runtime, which adds the ssh that Kubeflow's
# MPIJob launcher uses) and configs/, and runs as the non-root user bt (uid 1000).
#
#   docker build -t blutrain .
#   docker run --rm --gpus all blutrain --help
#   docker build --build-arg CUDA_TAG=13.0.0 --build-arg BT_CUDA_ARCHITECTURES="80;90" -t blutrain .
#
# The build stage installs MLIR 19 (Ubuntu 24.04's universe packages), so
# `blutrain` has the compiler (`train.compile`, docs/compiler.md); the runtime
# stage gets MLIR's shared libraries through `install-deps --runtime`, and
# libdevice.10.bc, which the compiler's CUDA path links into every kernel, from
# the build stage (the CUDA runtime image has no NVVM). BT_SKIP_MLIR=1 as a
# build argument leaves the compiler out (`train.compile: true` then says it is
# unavailable and trains eagerly) and the runtime stage about 210 MB smaller
# (the installed sizes of Debian 12's libmlir-19, libllvm19 and libz3-4).
# Not built here (no Docker engine on the development machine): the same
# MLIR-linked binary with those three libraries ran on the Ubuntu 24.04 GPU
# machine (scripts/gpu-compiler), and the ldd check below fails the build if
# a library is missing.

ARG CUDA_TAG=13.0.0
ARG BT_SKIP_MLIR=0

# ------------------------------------------------------------------ build
FROM nvidia/cuda:${CUDA_TAG}-devel-ubuntu24.04 AS build
ARG BT_CUDA_ARCHITECTURES=90
ARG BT_SKIP_MLIR
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# Dependencies first, so that editing sources does not reinstall them.
COPY scripts/install-deps scripts/install-deps
RUN BT_SKIP_MLIR="${BT_SKIP_MLIR}" BT_SKIP_NODE=1 BT_SKIP_SLURM=1 BT_SKIP_FUZZ=1 scripts/install-deps \
 && rm -rf /var/lib/apt/lists/*
COPY . .
RUN BT_CUDA_ARCHITECTURES="${BT_CUDA_ARCHITECTURES}" scripts/build --release --target blutrain \
 && strip --strip-unneeded build/blutrain \
 && mkdir -p /opt/libdevice && cp /usr/local/cuda/nvvm/libdevice/libdevice.10.bc /opt/libdevice/

# ------------------------------------------------------------------ runtime
FROM nvidia/cuda:${CUDA_TAG}-runtime-ubuntu24.04 AS runtime
ARG BT_SKIP_MLIR
ENV DEBIAN_FRONTEND=noninteractive
COPY scripts/install-deps /tmp/install-deps
RUN BT_SKIP_MLIR="${BT_SKIP_MLIR}" /tmp/install-deps --runtime \
 && rm -rf /var/lib/apt/lists/* /tmp/install-deps
COPY --from=build /src/build/blutrain /usr/local/bin/blutrain
# Where compiler/cuda_codegen.cpp (libdevice_path) looks first.
COPY --from=build /opt/libdevice/libdevice.10.bc /usr/local/cuda/nvvm/libdevice/libdevice.10.bc
COPY configs/ /opt/blutrain/configs/
# Fail the build, not the first run, when a shared library is missing (libcuda
# is the exception: the NVIDIA container runtime mounts it when the container starts).
RUN if ldd /usr/local/bin/blutrain | grep -v 'libcuda\.so' | grep 'not found'; then \
      echo "blutrain needs libraries that 'scripts/install-deps --runtime' does not install" >&2; exit 1; \
    fi \
 && (userdel --remove ubuntu 2>/dev/null || true) \
 && useradd --uid 1000 --create-home --shell /bin/bash bt
# bt is uid 1000 (ubuntu:24.04's own `ubuntu` user held it and is removed): the
# Kubernetes manifests (blutrain k8s render, k8s/) run the pods as uid 1000.
USER bt
WORKDIR /home/bt
ENTRYPOINT ["blutrain"]
CMD ["--help"]
