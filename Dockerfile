# pagewise with CUDA: build in the CUDA devel image, run in the CUDA runtime image.
#   docker build -t pagewise .
#   docker run --gpus all -p 8000:8000 -v hf-cache:/data/hf pagewise serve org/name
# A CPU-only image: build with --build-arg FEATURES= and run on any host.
ARG CUDA_VERSION=13.0.0
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
ARG FEATURES=cuda
ARG CUDA_COMPUTE_CAP=90
ENV CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP} PATH=/root/.cargo/bin:${PATH}
RUN apt-get update && apt-get install -y --no-install-recommends curl ca-certificates build-essential pkg-config \
    && rm -rf /var/lib/apt/lists/* \
    && curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain 1.95.0
WORKDIR /src
COPY . .
RUN cargo build --release --locked --features "${FEATURES}" --bin pagewise \
    && strip target/release/pagewise

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl python3 python3-pip \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 pagewise && mkdir -p /data/hf && chown pagewise /data/hf
COPY --from=build /src/target/release/pagewise /usr/local/bin/pagewise
USER pagewise
# MALLOC_ARENA_MAX=2: glibc keeps one arena per thread otherwise, and RSS creeps with each high-water mark.
ENV HF_HOME=/data/hf PAGEWISE_HOST=0.0.0.0 PAGEWISE_PORT=8000 MALLOC_ARENA_MAX=2
VOLUME ["/data/hf"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s CMD curl -fsS http://localhost:8000/health || exit 1
ENTRYPOINT ["pagewise"]
CMD ["serve"]
