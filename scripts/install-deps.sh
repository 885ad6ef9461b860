#!/usr/bin/env bash
# Installs what Quanta needs to build and test on Debian 12 / Ubuntu, and nothing that is
# already there. Quiet when everything is present. Also checks for the CUDA headers.
set -euo pipefail

packages=(
  build-essential cmake make pkg-config git ccache
  clang llvm libclang-rt-dev bpftool libbpf-dev libelf-dev zlib1g-dev libzstd-dev
  systemtap-sdt-dev
  libboost-dev libtomlplusplus-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libcli11-dev libyaml-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  runc crun podman prometheus tmux python3 binutils procps util-linux iproute2 jq
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Node.js and npm for the deploy/ schema validators (Debian's nodejs and npm, unless a Node.js
# is installed already), then the validators themselves, pinned by tests/deploy's
# package-lock.json into tests/deploy/node_modules (git-ignored); npm's cache lets later
# installs work offline.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: node and npm are missing; run as root or: sudo apt-get install nodejs npm" >&2
    exit 1
  fi
  echo "install-deps: installing nodejs npm"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
deploy_tests=$(cd "$(dirname "$0")/.." && pwd)/tests/deploy
if [[ ! -f $deploy_tests/node_modules/.package-lock.json ||
      $deploy_tests/package-lock.json -nt $deploy_tests/node_modules/.package-lock.json ]]; then
  echo "install-deps: installing the deploy validators (npm ci in tests/deploy)"
  (cd "$deploy_tests" && npm ci --no-audit --no-fund --prefer-offline --loglevel=error >/dev/null) || {
    echo "install-deps: npm ci in $deploy_tests failed (the npm registry, or its cache, is needed once)" >&2
    exit 1
  }
fi

cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [[ ! -f $cuda_home/include/cuda.h ]]; then
  cat >&2 <<MSG
install-deps: cuda.h not found in $cuda_home/include.
  Quanta builds against the CUDA driver API headers (CUDA >= 12) but runs without a GPU.
  Install the CUDA toolkit (for example the cuda-toolkit package from NVIDIA's Debian
  repository) or point CUDA_HOME at an existing toolkit, then run make again.
MSG
  exit 1
fi
version=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$cuda_home/include/cuda.h")
if ((version < 12000)); then
  echo "install-deps: $cuda_home/include/cuda.h is CUDA $version; Quanta needs CUDA >= 12 (set CUDA_HOME)" >&2
  exit 1
fi
