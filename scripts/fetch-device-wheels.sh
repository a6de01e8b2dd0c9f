#!/usr/bin/env bash
# The peers' wheels the lent H200 lacks, downloaded here into .whl/ (git-ignored) for a device call to
# carry (`carry: [".whl"]`, about 48 MB of the 64 MiB a call takes) and scripts/device-lib.sh's
# install_wheels to install: SGLang 0.5.23 (its Triton kernel: the sglang_triton peer), sgl-flash-mla
# 1.0.0 (the flashmla peer; its metadata asks for a newer torch than it needs, hence --no-deps) and
# nvidia-ml-py (bench telemetry). The device has torch 2.11 and triton 3.6 already.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl sglang==0.5.23 sgl-flash-mla==1.0.0 nvidia-ml-py
du -sh .whl/*.whl
