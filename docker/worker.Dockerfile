# syntax=docker/dockerfile:1
#
# The faultstream image: the `faultstream` command, run as a worker by default.
# One image serves every role of docker/compose.yaml: `worker`, `init-kafka` / `init-db` (init
# service) and `replay ... --to kafka://...` (replay job).
#
#   docker build -f docker/worker.Dockerfile -t faultstream:0.1.0 .      # context: repository root
#   docker run --rm faultstream:0.1.0 config                             # every setting, its env var
#
# Small: two stages, the runtime stage gets only the virtualenv; no compiler, no pip cache, and by
# default no embedded ClickHouse (chdb + pyarrow, ~0.6 GB), since the stack talks to a ClickHouse
# server. `--build-arg EMBEDDED=true` keeps it (for `replay` into a chdb:// store).
# Non-root: uid/gid 10001, numeric so that Kubernetes' runAsNonRoot can check it.
# Pinned: the base image by its exact Python and Debian version; the Python packages by
# pyproject.toml's pins.

FROM python:3.11.17-slim-bookworm AS build

ARG EMBEDDED=false
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/faultstream
WORKDIR /src

# Dependencies first: this layer is rebuilt only when pyproject.toml changes, not with the code.
COPY pyproject.toml ./
COPY docker/requirements.py docker/requirements.py
RUN python docker/requirements.py --embedded "$EMBEDDED" > requirements.txt \
    && /opt/faultstream/bin/pip install -r requirements.txt

# README.md: pyproject.toml names it as the package's readme.
COPY README.md ./
COPY schemas/ schemas/
COPY detectors/ detectors/
COPY stream/ stream/
# --no-deps: the dependencies are in already (and chdb is left out on purpose). The smoke check
# fails the build if the entry point cannot import.
RUN /opt/faultstream/bin/pip install --no-deps . \
    && /opt/faultstream/bin/faultstream --help > /dev/null


FROM python:3.11.17-slim-bookworm

LABEL org.opencontainers.image.title="faultstream" \
      org.opencontainers.image.description="Streaming reliability monitor for GPU clusters: Kafka -> detectors -> ClickHouse + incidents topic" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PATH=/opt/faultstream/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    FAULTSTREAM_DATA_DIR=/var/lib/faultstream \
    FAULTSTREAM_METRICS_HOST=0.0.0.0

RUN groupadd --system --gid 10001 faultstream \
    && useradd --system --uid 10001 --gid faultstream --home-dir /var/lib/faultstream \
        --no-create-home --shell /usr/sbin/nologin faultstream \
    && install -d -o faultstream -g faultstream -m 0750 /var/lib/faultstream

COPY --from=build /opt/faultstream /opt/faultstream

USER 10001:10001
WORKDIR /var/lib/faultstream
# The worker's Prometheus metrics (FAULTSTREAM_METRICS_PORT).
EXPOSE 9464
ENTRYPOINT ["faultstream"]
CMD ["worker"]
