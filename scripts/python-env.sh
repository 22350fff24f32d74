#!/usr/bin/env bash
# The Python environment of the tests: a venv at .venv in the repository (or $RESHARD_PYENV).
#   scripts/python-env.sh          numpy and ml_dtypes (the quant_ml_dtypes test)
#   scripts/python-env.sh --test   also what the Python package needs to build and be tested
#                                  (docs/python.md): nanobind, scikit-build-core, pytest and
#                                  PyTorch from PyPI
# Creates the venv only when it is missing and installs a package only when it does not import
# yet, quietly; prints one line saying what it did. scripts/build.sh configures the build with
# -DRESHARD_PYTHON=<venv>/bin/python3 (and the Python extension when nanobind is there).
#
# PyTorch: the wheel from PyPI is built for CUDA and names ~3 GB of CUDA libraries as
# dependencies. It imports on a machine without a GPU once the few it loads at import are
# present: with /usr/local/cuda (CUDA 13) there, this installs torch without dependencies plus
# nvidia-cufile, nvidia-cusparselt-cu13, nvidia-nvshmem-cu13, nvidia-nccl-cu13 (at torch's pins)
# and torch's pure-Python dependencies; if torch still does not import (no CUDA toolkit), it
# installs torch with all its dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir="${RESHARD_PYENV:-$PWD/.venv}"
python="$env_dir/bin/python3"
test_deps=0
if [ "${1:-}" = --test ]; then test_deps=1; fi
did=()
if [ ! -x "$python" ]; then
  python3 -m venv "$env_dir"
  did+=("created the venv")
fi
pip=("$python" -m pip install --quiet --disable-pip-version-check)
wanted=(numpy:numpy ml_dtypes:ml_dtypes)
if [ $test_deps = 1 ]; then
  wanted+=(nanobind:nanobind scikit_build_core:scikit-build-core pytest:pytest)
fi
missing=()
for entry in "${wanted[@]}"; do
  "$python" -c "import ${entry%%:*}" >/dev/null 2>&1 || missing+=("${entry#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  "${pip[@]}" "${missing[@]}"
  did+=("installed ${missing[*]}")
fi
if [ $test_deps = 1 ] && ! "$python" -c "import torch" >/dev/null 2>&1; then
  "${pip[@]}" --no-deps torch
  # torch's pins of the companions it loads at import, e.g. nvidia-nccl-cu13==2.30.7.
  mapfile -t companions < <("$python" - <<'PY'
import importlib.metadata as md
names = ("nvidia-cusparselt-cu13", "nvidia-nvshmem-cu13", "nvidia-nccl-cu13", "filelock",
         "typing-extensions", "sympy", "networkx", "jinja2", "fsspec")
for req in md.requires("torch") or []:
    spec = req.split(";")[0].strip()
    if spec.split("=")[0].split(">")[0].split("<")[0].split("[")[0].strip() in names:
        print(spec)
PY
)
  # pip lists torch's CUDA dependencies left out on purpose as conflicts: kept out of the log
  # unless the install fails.
  log="$(mktemp)"
  "${pip[@]}" nvidia-cufile "${companions[@]}" >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; exit 1; }
  rm -f "$log"
  if ! "$python" -c "import torch" >/dev/null 2>&1; then
    torch_version="$("$python" -c 'import importlib.metadata as m; print(m.version("torch"))')"
    echo "python-env: torch does not import with /usr/local/cuda's libraries; installing all of torch's dependencies"
    "${pip[@]}" "torch==$torch_version"
  fi
  "$python" -c "import torch" || { echo "python-env: torch does not import" >&2; exit 1; }
  did+=("installed torch $("$python" -c 'import torch; print(torch.__version__)')")
fi
if [ ${#did[@]} -eq 0 ]; then
  echo "python-env: $env_dir already has what it needs"
else
  echo "python-env: ${did[*]} in $env_dir"
fi
