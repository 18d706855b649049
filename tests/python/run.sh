#!/usr/bin/env bash
# The binding's tests (pytest) with Debian's torch, as CTest runs them.
# ctest-labels: python unit
# Debian's python3-torch and python3-pytest belong to /usr/bin/python3 (another python3 may be
# first on PATH); DDO_LIBRARY (set by CTest) is the library under test.
set -u
PY=${DDO_PYTHON:-/usr/bin/python3}
if ! "$PY" -c "import torch, pytest" 2>/dev/null; then
    echo "skipped: $PY lacks torch or pytest (apt-get install python3-torch python3-pytest)"
    exit 77
fi
cd "$(dirname "$0")"
exec "$PY" -m pytest -q -p no:cacheprovider .
