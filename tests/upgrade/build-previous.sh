#!/usr/bin/env bash
# Builds libquanta.so and quanta-arbiter of the release named in tests/upgrade/previous-release
# from this checkout's git history, into OUT/build (lib/libquanta.so, bin/quanta-arbiter), for
# the upgrade tests. Nothing is rebuilt while OUT/built-<commit> says it is done. With ccache,
# paths are hashed relative to OUT/src, so every clone shares one cache of those compiles.
set -euo pipefail
src=${1:?usage: build-previous.sh SOURCE_DIR OUT_DIR}
out=${2:?usage: build-previous.sh SOURCE_DIR OUT_DIR}
commit=$(sed -n 's/^commit=//p' "$src/tests/upgrade/previous-release")
[[ $commit =~ ^[0-9a-f]{40}$ ]] || { echo "build-previous.sh: $src/tests/upgrade/previous-release names no commit" >&2; exit 1; }
stamp=$out/built-$commit
[[ -f $stamp ]] && exit 0
if ! git -C "$src" cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "build-previous.sh: commit $commit (the previous release) is not in the history of $src;" \
       "a shallow clone needs 'git fetch --unshallow'" >&2
  exit 1
fi
rm -rf "$out/src" "$out/build" "$out"/built-*
mkdir -p "$out/src"
git -C "$src" archive "$commit" | tar -x -C "$out/src"
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$out/src CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
echo "build-previous.sh: building libquanta.so and quanta-arbiter of $commit in $out"
cmake -S "$out/src" -B "$out/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQUANTA_BUILD_BPF=OFF \
  "${launcher[@]}" >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log" >&2; exit 1; }
cmake --build "$out/build" -j "$(nproc)" --target quanta quanta-arbiter >"$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log" >&2; exit 1; }
touch "$stamp"
