#!/usr/bin/env bash
# `make gpu-kit`: gathers what tests/gpu/check.sh needs on a GPU machine into gpu-kit/
# (bin/, lib/, sim/, the scripts). Binaries need only libc and the C++ runtime (libbpf is
# static, spdlog/fmt/toml++ header-only), except quanta-arbiter's libcpp-httplib (the
# /metrics endpoint), which travels in lib/ (the arbiter looks in ../lib first). Its own
# dependencies (libssl3, zlib, brotli) travel in lib/fallback/: check.sh uses one from there
# only where the GPU machine lacks it, so the machine's own copies win.
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
httplib=$(ldd "$build/bin/quanta-arbiter" | awk '/libcpp-httplib/ {print $3}')
if [[ -n $httplib ]]; then
  cp -L "$httplib" "$kit/lib/$(basename "$httplib")"
  mkdir -p "$kit/lib/fallback"
  ldd "$httplib" | awk '/=> \// && !/lib(c|m|gcc_s|stdc\+\+)\.so/ {print $3}' |
    while read -r dep; do cp -L "$dep" "$kit/lib/fallback/$(basename "$dep")"; done
fi
cp -P "$build"/sim/lib* "$kit/sim/"
cp "$root/tests/gpu/check.sh" "$root/tests/gpu/torch_checks.py" "$root/tests/gpu/nvml_procs.py" "$kit/"
# Debug info off: the kit must travel small (USDT notes and symbols stay).
find "$kit/bin" "$kit/lib" "$kit/sim" -type f -exec strip --strip-debug {} +
echo "gpu-kit: $kit ($(du -sh "$kit" | cut -f1)); run: $kit/check.sh  (or --sim)"
