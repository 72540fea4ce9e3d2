# CPU image of pagewise. (The CUDA image arrives with the CUDA backend.)
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked && strip target/release/pagewise

FROM debian:bookworm-slim
COPY --from=build /src/target/release/pagewise /usr/local/bin/pagewise
ENTRYPOINT ["pagewise"]
