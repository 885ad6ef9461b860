#!/bin/sh
# Checks that a libquanta.so build loads in any container: it needs only libc (and the
# libdl/libpthread names older glibc splits out), no glibc symbol version newer than
# 2.17, no C++ runtime, and exports only the interposed entry points.
# Usage: check_exports.sh path/to/libquanta.so [path/to/shim/interposed.h]
# With interposed.h, the exports must be exactly its list plus dlsym.
set -u
lib=$1
table=${2:-}
status=0
fail() { echo "check_exports: $lib: $*" >&2; status=1; }

needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[ -n "$needed" ] || fail "readelf found no NEEDED entries"
for n in $needed; do
  case $n in
    libc.so.6 | libdl.so.2 | libpthread.so.0) ;;
    *) fail "needs $n (allowed: libc.so.6, libdl.so.2, libpthread.so.0)" ;;
  esac
done

symbols=$(objdump -T "$lib") || fail "objdump -T failed"
# Versions of undefined references: GLIBC_2.x must be <= 2.17; nothing from GCC/C++ runtimes.
echo "$symbols" | awk '/\*UND\*/ { for (i = 1; i <= NF; i++) if ($i ~ /^\(?(GLIBC|GLIBCXX|CXXABI|GCC)_/) print $i, $NF }' |
  tr -d '()' | while read -r version name; do
    case $version in
      GLIBC_2.*)
        minor=${version#GLIBC_2.}
        minor=${minor%%.*}
        [ "$minor" -le 17 ] || { echo "check_exports: $lib: $name needs $version (newest allowed: GLIBC_2.17)" >&2; echo bad; }
        ;;
      *) echo "check_exports: $lib: $name comes from $version (no C++ or libgcc_s runtime allowed)" >&2; echo bad ;;
    esac
  done | grep -q bad && status=1

# Defined exports: only cu*, nvml* and dlsym.
exports=$(echo "$symbols" | awk '$0 !~ /\*UND\*/ && ($2 == "g" || $2 == "w") && NF >= 6 { print $NF }')
for e in $exports; do
  case $e in
    cu* | nvml* | dlsym) ;;
    *) fail "exports $e (only the interposed cu*, nvml* and dlsym may be visible)" ;;
  esac
done
for required in dlsym cuGetProcAddress cuGetProcAddress_v2 cuLaunchKernel cuLaunchKernel_ptsz cuMemAlloc_v2 \
  cuMemFree_v2 cuMemGetInfo_v2 nvmlDeviceGetMemoryInfo_v2; do
  echo "$exports" | grep -qx "$required" || fail "does not export $required"
done
if [ -n "$table" ]; then
  listed=$( (sed -n '/clang-format off/,/clang-format on/p' "$table" |
    grep -oE 'X\((cu|nvml)[A-Za-z0-9_]*\)' | sed 's/^X(\(.*\))$/\1/'; echo dlsym) | sort -u)
  actual=$(echo "$exports" | sort -u)
  [ "$listed" = "$actual" ] || fail "exports differ from $table: $(printf '%s\n' "$listed" "$actual" | sort | uniq -u | tr '\n' ' ')"
fi
[ $status -eq 0 ] && echo "check_exports: $lib: NEEDED $(echo $needed), $(echo "$exports" | wc -l) exports, glibc <= 2.17"
exit $status
