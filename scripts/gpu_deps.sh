#!/usr/bin/env bash
# Copy qmoe's build dependencies (fmt, nlohmann_json, CLI11, GTest/GMock, RE2 + pkg-config: headers, CMake configs,
# libraries) out of this Debian/Ubuntu machine's installed packages into a prefix (default
# build-deps/usr), for a GPU machine that lacks them and has no network. gpu_check.sh picks the
# prefix up by itself (or set QMOE_DEPS).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$ROOT/build-deps}
mkdir -p "$DEST"
pkgs=(nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libfmt-dev libre2-dev pkgconf pkgconf-bin pkg-config)
pkgs+=($(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 'libre2-[0-9]*' 'libpkgconf[0-9]*' 2>/dev/null | awk '$1 == "ii" {print $2}' || true))
pkgs+=($(dpkg-query -W -f='${Package}\n' 'libfmt[0-9]*' 2>/dev/null | grep -v dev || true))
for p in "${pkgs[@]}"; do dpkg -L "$p"; done | sort -u | while read -r f; do
  if [ -f "$f" ] || [ -L "$f" ]; then case "$f" in /usr/share/doc/*) ;; *) echo "${f#/}" ;; esac; fi
done | tar -C / -cf - -T - | tar -C "$DEST" -xf -
du -sh "$DEST"
