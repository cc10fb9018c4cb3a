# syntax=docker/dockerfile:1
#
# The provider's image for multi-arch builds with a container engine: built with the locked
# dependencies, run on distroless/cc (glibc and libgcc_s: what `ldd` shows the binary links,
# nothing else — no shell, no package manager). The image built and tested in CI is
# `cargo xtask image`'s (a distroless-like base made from Debian packages; README,
# "Container image").
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" \
#     -t ghcr.io/oci-vault-csi/oci-secrets-store-csi-driver-provider:0.1.0 --push .
#
# The build stage runs on the build machine's platform and cross-compiles for the target
# one (no emulation). Base images are pinned by digest; refresh them with
# `docker buildx imagetools inspect <image>:<tag>` when bumping (README, "Container image").

ARG RUST_IMAGE=docker.io/library/rust:1.94-bookworm@sha256:1685eb7dd8d23b3eed9c95094b9f590487e25ae46bab8f76ea488c4000404322
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12@sha256:847433844c7e04bcf07a3a0f0f5a8de554c6df6fa9e3e3ab14d3f6b73d780235

FROM --platform=$BUILDPLATFORM ${RUST_IMAGE} AS build
ARG TARGETARCH
# Cargo features of the binary: `--build-arg FEATURES=fips` builds on AWS-LC's FIPS module
# (aws-lc-fips-sys, whose build needs cmake and Go: installed below for it).
ARG FEATURES=""
WORKDIR /src
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# A C cross toolchain for ring and jemalloc's build scripts when the target differs. The
# cross packages come from the digest-pinned Debian release's archive; their versions are
# the release's, not pinned one by one.
# hadolint ignore=DL3008
RUN set -eux; \
    case "${TARGETARCH}" in \
      amd64) echo x86_64-unknown-linux-gnu > /target ;; \
      arm64) echo aarch64-unknown-linux-gnu > /target ;; \
      *) echo "unsupported TARGETARCH ${TARGETARCH}" >&2; exit 1 ;; \
    esac; \
    if [ "$(uname -m)" != "$(cut -d- -f1 /target)" ]; then \
      apt-get update; \
      apt-get install -y --no-install-recommends "gcc-$(cut -d- -f1 /target | tr _ -)-linux-gnu" libc6-dev-"${TARGETARCH}"-cross; \
      rm -rf /var/lib/apt/lists/*; \
    fi; \
    case ",${FEATURES}," in \
      *,fips,*) apt-get update; apt-get install -y --no-install-recommends cmake golang-go; rm -rf /var/lib/apt/lists/* ;; \
    esac; \
    rustup target add "$(cat /target)"
COPY Cargo.toml Cargo.lock ./
COPY bin bin
COPY crates crates
COPY xtask xtask
ENV CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=x86_64-linux-gnu-gcc \
    CC_x86_64_unknown_linux_gnu=x86_64-linux-gnu-gcc
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eux; \
    target="$(cat /target)"; \
    if [ "$(uname -m)" = "$(cut -d- -f1 /target)" ]; then \
      unset CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER CC_aarch64_unknown_linux_gnu \
            CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER CC_x86_64_unknown_linux_gnu; \
    fi; \
    cargo build --release --locked --target "${target}" -p oci-secrets-store-csi-driver-provider \
      ${FEATURES:+--features "${FEATURES}"}; \
    cp "target/${target}/release/oci-secrets-store-csi-driver-provider" /provider

FROM ${RUNTIME_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="oci-secrets-store-csi-driver-provider" \
      org.opencontainers.image.description="OCI Vault provider for the Kubernetes Secrets Store CSI driver" \
      org.opencontainers.image.source="https://github.com/oci-vault-csi/oci-secrets-store-csi-driver-provider" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /provider /oci-secrets-store-csi-driver-provider
COPY LICENSE /LICENSE
# Root: the socket is created in a hostPath directory owned by root (the chart drops every
# capability and makes the root filesystem read-only).
# hadolint ignore=DL3002
USER 0:0
ENTRYPOINT ["/oci-secrets-store-csi-driver-provider"]
