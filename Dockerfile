# syntax=docker/dockerfile:1
# The one gpuhealth image: `gpuhealth exporter` (DaemonSet or cluster Deployment), `gpuhealth
# responder`, and the operator commands (`gpuhealth quarantine`, `gpuhealth breaker`). The
# manifests under deploy/ set only `args`; the entry point is the `gpuhealth` console script.
#
#   docker build -t ghcr.io/gpuhealth/gpuhealth:0.1.0 .
#
# NVML: nothing NVIDIA is installed here. On a GPU node the NVIDIA container runtime mounts
# the driver's libnvidia-ml.so (runtimeClassName: nvidia, NVIDIA_DRIVER_CAPABILITIES=utility),
# which nvidia-ml-py loads; a glibc base is required for that, hence Debian slim, not Alpine.

ARG PYTHON=python:3.11-slim-bookworm

FROM ${PYTHON} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
# The product's packages, the ones pyproject.toml packs; the test harness (simulator, demo,
# bench, dashboards) stays out, and with it its dependencies (the `sim` and `dev` extras).
COPY gpuhealth/ gpuhealth/
COPY gpuhealth_cli/ gpuhealth_cli/
COPY exporter/ exporter/
COPY responder/ responder/
COPY rules/ rules/
COPY kubectl_gpuhealth/ kubectl_gpuhealth/
COPY backtest/ backtest/
RUN python -m venv /opt/gpuhealth \
 && /opt/gpuhealth/bin/pip install --no-compile . \
 && /opt/gpuhealth/bin/gpuhealth --help >/dev/null \
 && /opt/gpuhealth/bin/gpuhealth rules render --check >/dev/null

FROM ${PYTHON}
COPY --from=build /opt/gpuhealth /opt/gpuhealth
ENV PATH=/opt/gpuhealth/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root by default (the responder and the cluster-mode exporter run so). The node-mode
# exporter's DaemonSet runs it as root with every capability dropped, only to write its device
# directory on a root-owned host path.
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["gpuhealth"]
CMD ["--help"]
