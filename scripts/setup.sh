#!/usr/bin/env bash
# Idempotent: install the Debian packages qmoe builds with, only those that are missing.
# QMOE_SETUP_FUZZ=1 adds clang and its libFuzzer runtime (the CI fuzz step); QMOE_SETUP_CCACHE=1
# adds ccache (.ci/run shares the CPU objects of its Release and CUDA builds through it).
set -euo pipefail
pkgs=(cmake make g++ googletest libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev libfmt-dev
      libre2-dev pkg-config)
if [ "${QMOE_SETUP_FUZZ:-0}" = 1 ]; then pkgs+=(clang libclang-rt-dev); fi
if [ "${QMOE_SETUP_CCACHE:-0}" = 1 ]; then pkgs+=(ccache); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
