#!/usr/bin/env bash
# Installs the Python package (pip install .: pyproject.toml, docs/python.md) into the test venv
# from the C++ build tree, so nothing is compiled twice: scikit-build-core reuses the tree
# (-Cbuild-dir), rebuilds what changed and installs libreshard and reshard._reshard into the
# wheel. The tree must have been configured with the Python extension (scripts/build.sh does
# when nanobind is in the venv: scripts/python-env.sh --test).
#   scripts/python-install.sh [BUILD_DIR]     (default: $RESHARD_BUILD_DIR or build)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-${RESHARD_BUILD_DIR:-build}}"
python="${RESHARD_PYENV:-$PWD/.venv}/bin/python3"
cache="$build/CMakeCache.txt"
if ! grep -q '^RESHARD_BUILD_PYTHON:BOOL=ON' "$cache" 2>/dev/null; then
  echo "python-install: $build is not configured with the Python extension (RESHARD_BUILD_PYTHON); run scripts/python-env.sh --test, then scripts/build.sh" >&2
  exit 1
fi
# scikit-build-core deletes a tree's CMakeCache.txt when the record it keeps there names another
# scikit-build-core installation (another venv): that would reconfigure this tree for the wheel
# alone (no tests, no tools) and rebuild it whole. The tree is ours; forget the record.
rm -f "$build/.skbuild-info.json"
# The tree's own generator, or scikit-build-core would ask for another and CMake would refuse.
CMAKE_GENERATOR="$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$cache")"
export CMAKE_GENERATOR
"$python" -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps \
  --force-reinstall -Cbuild-dir="$build" -Cbuild.verbose=false .
"$python" -c "import reshard, sys; print('python-install: reshard', reshard.__version__, 'in', reshard.__file__.rsplit('/', 2)[0])"
