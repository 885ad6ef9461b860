#!/bin/bash
# Every file of a room is named in that room's README.md, so a newcomer finds any behaviour
# by folder and file name. A file counts as named as `name.ext`, `name.{…,ext,…}` or
# `name.*`. Usage: check_rooms.sh SOURCE_DIR [ROOM...]
set -u
src=$1
shift
rooms=("$@")
[ ${#rooms[@]} -gt 0 ] || rooms=(common hosted config arbiter arbiter/scheduling arbiter/state arbiter/serving arbiter/observing arbiter/loop quantactl hooks shim shim/interpose shim/link shim/base bpf bench tests tests/support)
missing=0
for room in "${rooms[@]}"; do
  readme="$src/$room/README.md"
  if [ ! -f "$readme" ]; then
    echo "$room/: no README.md naming its files"
    missing=$((missing + 1))
    continue
  fi
  while IFS= read -r file; do
    name=${file##*/}
    [ "$name" = README.md ] && continue
    base=${name%%.*}
    ext=${name#*.}
    grep -qF -- "$name" "$readme" && continue
    grep -qE -- "(^|[^A-Za-z0-9_])${base//./\\.}\.(\*|\{([^}]*,)?${ext//./\\.}(,[^}]*)?\})" "$readme" && continue
    echo "$room/$name is not named in $room/README.md"
    missing=$((missing + 1))
  done < <(git -C "$src" ls-files -- "$room" | grep -E "^$room/[^/]+$")
done
if [ "$missing" -ne 0 ]; then
  echo "$missing file(s) or room(s) unnamed: add each to its room's table, saying what it holds"
  exit 1
fi
echo "every file of ${#rooms[@]} rooms is named in its README"
