# pagewise as a container image. Two ways to get the binary in:
#
#   runtime (default target): compiled inside the image, in the CUDA devel image, for real
#   deployments:
#     docker build -t pagewise .
#     docker run --gpus all --ipc=host -p 8000:8000 -v pagewise-data:/data pagewise serve org/name
#   It is built with tensor parallelism (FEATURES=nccl; NCCL from NVIDIA's PyPI wheel, shipped in
#   /opt/pagewise/lib): `serve org/name --tensor-parallel-size 2` uses two of the GPUs given.
#   A single-GPU image without NCCL: --build-arg FEATURES=cuda. A CPU-only image:
#   --build-arg FEATURES= (and any Debian/Ubuntu base images below).
#
#   prebuilt: packages a `pagewise` binary built outside the image, copied to dist/pagewise first
#   (what CI does: rustup is unreachable there). Same runtime layout, user, healthcheck:
#     cp target/release/pagewise dist/ && docker build --target prebuilt -t pagewise .
#
# Base images are build arguments; the defaults are NVIDIA's CUDA images. The runtime base needs
# apt (Debian or Ubuntu).
ARG CUDA_VERSION=13.0.0
ARG BUILD_IMAGE=nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04
ARG RUNTIME_IMAGE=nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
ARG FEATURES=nccl
ARG CUDA_COMPUTE_CAP=90
ARG NCCL_WHEEL=nvidia-nccl-cu13==2.30.7
ENV CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP} PATH=/root/.cargo/bin:${PATH} LIBRARY_PATH=/opt/pagewise/lib
RUN apt-get update && apt-get install -y --no-install-recommends curl ca-certificates build-essential pkg-config \
       python3 python3-pip \
    && rm -rf /var/lib/apt/lists/* \
    && curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain 1.95.0
# NCCL (FEATURES with nccl): libnccl.so.2 from NVIDIA's wheel, linked against here and copied into
# the final image, whatever the base images ship. /opt/pagewise/lib exists (empty) without it.
RUN mkdir -p /opt/pagewise/lib && case ",${FEATURES}," in *nccl*) \
       python3 -m pip install --no-deps --break-system-packages --target /tmp/nccl "${NCCL_WHEEL}" \
       && cp /tmp/nccl/nvidia/nccl/lib/libnccl.so.2 /opt/pagewise/lib/ \
       && ln -s libnccl.so.2 /opt/pagewise/lib/libnccl.so && rm -rf /tmp/nccl ;; esac
WORKDIR /src
# Dependency layer: the manifests, the kernel crates (they change rarely) and an empty app, built
# once, so a change to the app's sources rebuilds only the app.
COPY Cargo.toml Cargo.lock rust-toolchain.toml ./
COPY .cargo .cargo
COPY kernels kernels
COPY cpu cpu
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && for b in scheduler_step hot_paths; do echo 'fn main() {}' > benches/$b.rs; done \
    && cargo build --release --locked --features "${FEATURES}" --bin pagewise
COPY . .
# COPY keeps the sources' own times, which may be older than the placeholders': touch them.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --features "${FEATURES}" --bin pagewise \
    && strip target/release/pagewise

# What every final image has: a non-root user, the data volume (model cache), the healthcheck.
FROM ${RUNTIME_IMAGE} AS base
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl python3 python3-pip \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 pagewise \
    && mkdir -p /data/hf /data/pagewise && chown -R pagewise /data
USER pagewise
# HF_HOME and PAGEWISE_CACHE_DIR on the volume: downloaded models survive the container.
# MALLOC_ARENA_MAX=2: glibc keeps one arena per thread otherwise, and RSS creeps with each
# high-water mark (benches/RESULTS.md, the soak).
ENV HF_HOME=/data/hf PAGEWISE_CACHE_DIR=/data/pagewise PAGEWISE_HOST=0.0.0.0 PAGEWISE_PORT=8000 \
    MALLOC_ARENA_MAX=2
VOLUME ["/data"]
EXPOSE 8000
# /health is 503 once the engine has died (the process then exits 1 as well).
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s CMD curl -fsS http://localhost:8000/health || exit 1
# SIGTERM drains: /ready turns 503, in-flight requests finish (up to --shutdown-timeout), exit 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["pagewise"]
CMD ["serve"]

FROM base AS prebuilt
COPY --chown=root:root dist/pagewise /usr/local/bin/pagewise

FROM base AS runtime
COPY --from=build /opt/pagewise/lib /opt/pagewise/lib
ENV LD_LIBRARY_PATH=/opt/pagewise/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}
COPY --from=build /src/target/release/pagewise /usr/local/bin/pagewise
