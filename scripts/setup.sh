#!/usr/bin/env bash
# Installs what ccs builds with (Debian 12, as root or with sudo) and builds it.
#   scripts/setup.sh [BUILD_DIR] [extra cmake arguments...]
#   scripts/setup.sh --deps-only
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true

packages=(build-essential cmake pkg-config libuv1-dev libprotobuf-c-dev protobuf-c-compiler
          libcmocka-dev libibverbs-dev libinih-dev libsystemd-dev libsodium-dev uthash-dev
          clang libclang-rt-14-dev
          systemd python3 python3-prometheus-client openmpi-bin libopenmpi-dev
          python3-numpy python3-pytest python3-venv python3-pip)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ "$build" = --deps-only ] && exit 0
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
