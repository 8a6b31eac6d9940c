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
# The image is built without MLIR (BT_SKIP_MLIR=1), so the runtime stage needs
# no LLVM/MLIR libraries; in it, `train.compile: true` says the compiler is not
# available and trains eagerly. The compiler generates CPU code only so far
# (docs/compiler.md); shipping it in the image, once it generates CUDA code,
# needs MLIR 19's libMLIR and libLLVM in the runtime stage.

ARG CUDA_TAG=13.0.0

# ------------------------------------------------------------------ build
FROM nvidia/cuda:${CUDA_TAG}-devel-ubuntu24.04 AS build
ARG BT_CUDA_ARCHITECTURES=90
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# Dependencies first, so that editing sources does not reinstall them.
COPY scripts/install-deps scripts/install-deps
RUN BT_SKIP_MLIR=1 BT_SKIP_NODE=1 BT_SKIP_SLURM=1 scripts/install-deps \
 && rm -rf /var/lib/apt/lists/*
COPY . .
RUN BT_CUDA_ARCHITECTURES="${BT_CUDA_ARCHITECTURES}" scripts/build --release --target blutrain \
 && strip --strip-unneeded build/blutrain

# ------------------------------------------------------------------ runtime
FROM nvidia/cuda:${CUDA_TAG}-runtime-ubuntu24.04 AS runtime
ENV DEBIAN_FRONTEND=noninteractive
COPY scripts/install-deps /tmp/install-deps
RUN /tmp/install-deps --runtime \
 && rm -rf /var/lib/apt/lists/* /tmp/install-deps
COPY --from=build /src/build/blutrain /usr/local/bin/blutrain
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
