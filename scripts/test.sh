#!/usr/bin/env bash
# Quick-start command 2: install what is missing, build, install the Python package into .venv
# and run every test with ctest (the C++ suites and the Python package's); then the
# unit and multi-process suites again under ASan + UBSan and the net and api suites under TSan
# (scripts/sanitizers.sh; docs/testing.md). Arguments go to the first ctest only.
# RESHARD_SANITIZERS=0 skips the sanitizer stages (quick local runs; CI runs them).
# Tests labelled netns need root; gpu tests skip without a device. Fails when no test ran.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
# The Python package's build and test dependencies (PyTorch among them), the build with the
# extension, and the package installed into .venv the way users install it (pip install .),
# from the same build tree.
./scripts/python-env.sh --test
./scripts/build.sh
./scripts/python-install.sh
t1=$(date +%s)
echo "test: build $((t1 - t0)) s"
build="${RESHARD_BUILD_DIR:-build}"
# The ml_dtypes comparison (quant_ml_dtypes) must run here: without numpy and ml_dtypes it fails
# instead of skipping (also in the sanitizer stages, which inherit this).
export RESHARD_REQUIRE_PYTHON_DEPS=1
(cd "$build" && ctest --output-on-failure --no-tests=error -j "${RESHARD_TEST_JOBS:-2}" \
  --timeout 600 "$@")
echo "test: tests $(($(date +%s) - t1)) s"
if [ "${RESHARD_SANITIZERS:-1}" != 0 ]; then
  ./scripts/sanitizers.sh
fi
