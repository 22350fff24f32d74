#!/usr/bin/env bash
# Installs missing packages, configures and builds reshard into build/ (or $RESHARD_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# numpy and ml_dtypes for the quant_ml_dtypes test, in .venv (or $RESHARD_PYENV). Without them
# (no network) the build goes on and that test skips, or fails under scripts/test.sh.
python_env="${RESHARD_PYENV:-$PWD/.venv}"
python_args=()
if ! ./scripts/python-env.sh; then
  echo "build: scripts/python-env.sh failed: the quant_ml_dtypes test cannot check against ml_dtypes" >&2
fi
if [ -x "$python_env/bin/python3" ]; then
  python_args=(-DRESHARD_PYTHON="$python_env/bin/python3")
  # The Python extension (python/) when the venv can build it (scripts/python-env.sh --test,
  # which scripts/test.sh runs); its tests then run against the package installed in the venv
  # (scripts/python-install.sh).
  if "$python_env/bin/python3" -c "import nanobind" >/dev/null 2>&1; then
    python_args+=(-DRESHARD_BUILD_PYTHON=ON -DPython_EXECUTABLE="$python_env/bin/python3")
  fi
  # With torch there, plan_torch_tiles checks `reshard plan --tiles` against torch's tiles.
  if "$python_env/bin/python3" -c "import torch" >/dev/null 2>&1; then
    python_args+=(-DRESHARD_TORCH_PYTHON="$python_env/bin/python3")
  fi
fi
build="${RESHARD_BUILD_DIR:-build}"
jobs="${RESHARD_JOBS:-$(nproc)}"
# Line tables only (-g1): backtraces, sanitizer reports, perf and callgrind still name files
# and lines, and a full build compiles about a quarter faster than with -g (types and variables
# for a debugger). RESHARD_DEBUG_INFO=full keeps -g.
g=-g1
if [ "${RESHARD_DEBUG_INFO:-lines}" = full ]; then g=-g; fi
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 $g -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 $g -DNDEBUG" \
  "${python_args[@]}" >"$build/reshard-configure.log" 2>&1 || {
  cat "$build/reshard-configure.log" >&2
  exit 1
}
cmake --build "$build" -j "$jobs"
