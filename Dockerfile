# syntax=docker/dockerfile:1
# One image for every part of textgen: textgen-operator, textgen-router, textgen-shard and
# textgen-launcher (the operator gives this image to the pods it creates). The build stage compiles
# with CUDA 13 (kernels for sm_80 and sm_90a) on Debian 12, as the development machines do; the
# runtime stage carries the binaries, their shared libraries and the CUDA runtime libraries.
#
#   docker build --build-arg CUDA_KEYRING=<URL of NVIDIA's cuda-keyring .deb for debian12/x86_64> \
#     -t textgen:0.1.0 .
# then push it to your registry and set the chart's image.repository. The CUDA repository is a build
# argument: no archive's host is written into this repository.
#
# Not built in CI (its machines have no container engine): CI builds the same tree natively.
ARG DEBIAN=bookworm

FROM debian:${DEBIAN} AS build
ARG CUDA_APT=13-0
ARG CUDA_KEYRING
RUN test -n "$CUDA_KEYRING" || { echo "pass --build-arg CUDA_KEYRING=<cuda-keyring .deb URL>" >&2; exit 1; }
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl gnupg && \
    curl -fsSL "$CUDA_KEYRING" \
      -o /tmp/cuda-keyring.deb && dpkg -i /tmp/cuda-keyring.deb && apt-get update && \
    apt-get install -y --no-install-recommends cuda-nvcc-${CUDA_APT} cuda-cudart-dev-${CUDA_APT} \
      libcublas-dev-${CUDA_APT} cuda-cupti-dev-${CUDA_APT} libnccl-dev && \
    rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/local/cuda/bin:$PATH
WORKDIR /src
COPY tools/install-deps.sh tools/sid-apt.sh tools/fetch-minja.sh tools/fetch-prometheus-cpp.sh \
     tools/fetch-swagger-ui.sh tools/
# The build's Debian packages (the npm test clients are not needed here).
RUN sed -i 's/^  install_clients$/  true/; s/^install_clients$/true/' tools/install-deps.sh && \
    bash tools/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTEXTGEN_BUILD_TESTS=OFF \
      -DTEXTGEN_BUILD_BENCH=OFF && \
    cmake --build /build --target textgen-operator textgen-router textgen-shard textgen-launcher && \
    mkdir -p /out/bin /out/lib /out/share/textgen && \
    cp -r /build/swagger-ui /out/share/textgen/ && \
    cp /build/textgen-operator /build/textgen-router /build/textgen-shard /build/textgen-launcher /out/bin/ && \
    strip --strip-unneeded /out/bin/* && \
    for b in /out/bin/*; do ldd "$b" | awk '/=> \//{print $3}'; done | sort -u | \
      grep -v -E 'lib(c|m|dl|rt|pthread|cuda|cudart|cublas|cublasLt|nccl)\.so' | \
      xargs -r -I{} cp -L {} /out/lib/

FROM debian:${DEBIAN}-slim
ARG CUDA_APT=13-0
ARG CUDA_KEYRING
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl gnupg util-linux && \
    curl -fsSL "$CUDA_KEYRING" \
      -o /tmp/cuda-keyring.deb && dpkg -i /tmp/cuda-keyring.deb && apt-get update && \
    apt-get install -y --no-install-recommends cuda-cudart-${CUDA_APT} libcublas-${CUDA_APT} libnccl2 && \
    apt-get purge -y curl gnupg && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* /tmp/*.deb
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/lib/ /usr/local/lib/textgen/
# /docs: the router finds Swagger UI's files in <its dir>/../share/textgen/swagger-ui.
COPY --from=build /out/share/textgen/ /usr/local/share/textgen/
ENV LD_LIBRARY_PATH=/usr/local/lib/textgen:/usr/local/cuda/lib64 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    HF_HOME=/data
# The operator runs as 65532 (the chart's securityContext); shard and router pods as the image's user.
RUN useradd --uid 65532 --create-home textgen && mkdir -p /data && chown textgen /data
USER 65532
EXPOSE 3000 50051 8080
ENTRYPOINT []
CMD ["textgen-launcher"]
