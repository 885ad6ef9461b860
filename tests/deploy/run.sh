#!/usr/bin/env bash
# Runs one deploy/ check (a Node script here) once the pinned validators are installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ ! -d $here/node_modules/kubernetes-models || ! -d $here/node_modules/yaml ]]; then
  echo "tests/deploy/node_modules is missing the validators: run scripts/install-deps.sh (npm ci in tests/deploy)" >&2
  exit 1
fi
exec node "$here/$1" "${@:2}"
