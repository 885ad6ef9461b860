#!/usr/bin/env bash
# `make gpu-kit`: gathers what tests/gpu/check.sh needs on a GPU machine into gpu-kit/
# (bin/, lib/, sim/, the scripts). Binaries need only libc and the C++ runtime (libbpf is
# static, spdlog/fmt/toml++ header-only).
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
kit=$root/gpu-kit
rm -rf "$kit"
mkdir -p "$kit/bin" "$kit/lib" "$kit/sim"
for b in quanta-arbiter quantactl quanta-tenant quanta-bench quanta-bench-report quanta-bench-launch-loop quanta-trace; do
  [[ -x $build/bin/$b ]] && cp "$build/bin/$b" "$kit/bin/"
done
cp "$build/lib/libquanta.so" "$kit/lib/"
cp -P "$build"/sim/lib* "$kit/sim/"
cp "$root/tests/gpu/check.sh" "$root/tests/gpu/torch_checks.py" "$root/tests/gpu/nvml_procs.py" "$kit/"
# Debug info off: the kit must travel small (USDT notes and symbols stay).
find "$kit/bin" "$kit/lib" "$kit/sim" -type f -exec strip --strip-debug {} +
echo "gpu-kit: $kit ($(du -sh "$kit" | cut -f1)); run: $kit/check.sh  (or --sim)"
