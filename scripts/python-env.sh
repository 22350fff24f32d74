#!/usr/bin/env bash
# The Python environment of the quant_ml_dtypes test (tests/quant/check_ml_dtypes.py): a venv at
# .venv in the repository (or $RESHARD_PYENV) holding numpy and ml_dtypes. Creates the venv only
# when it is missing and installs a package only when it does not import yet, quietly; prints one
# line saying what it did. Configure with -DRESHARD_PYTHON=<venv>/bin/python3 (scripts/build.sh
# does).
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir="${RESHARD_PYENV:-$PWD/.venv}"
python="$env_dir/bin/python3"
did=()
if [ ! -x "$python" ]; then
  python3 -m venv "$env_dir"
  did+=("created the venv")
fi
missing=()
for package in numpy ml_dtypes; do
  "$python" -c "import $package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  "$python" -m pip install --quiet --disable-pip-version-check "${missing[@]}"
  did+=("installed ${missing[*]}")
fi
if [ ${#did[@]} -eq 0 ]; then
  echo "python-env: $env_dir already has numpy and ml_dtypes"
else
  echo "python-env: ${did[0]}${did[1]:+ and ${did[1]}} in $env_dir"
fi
