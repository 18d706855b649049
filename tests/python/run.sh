#!/usr/bin/env bash
# The binding's tests (pytest) with Debian's torch, as CTest runs them.
# ctest-labels: python unit
# Debian's python3-torch and python3-pytest belong to /usr/bin/python3 (another python3 may be
# first on PATH); DDO_LIBRARY (set by CTest) is the library under test.
#
# With DDOTEST_WHEEL (`make test` builds the wheel and sets it; not a DDO_* name, which the tool
# would warn about) the tests run as a user has ddo: the wheel installed into a fresh
# `python3 -m venv --system-site-packages` (torch from Debian), the tests run from outside the
# source tree against the installed package and its own libddo.so, and the venv's `ddo --help`,
# `python -m ddo version` and `ddo demo` run first.
set -u
PY=${DDO_PYTHON:-/usr/bin/python3}
if ! "$PY" -c "import torch, pytest" 2>/dev/null; then
    echo "skipped: $PY lacks torch or pytest (apt-get install python3-torch python3-pytest)"
    exit 77
fi
tests=$(cd "$(dirname "$0")" && pwd)
if [ -z "${DDOTEST_WHEEL:-}" ]; then
    cd "$tests"
    exec "$PY" -m pytest -q -p no:cacheprovider .
fi

set -e
venv=${DDO_BUILD_DIR:-$(mktemp -d)}/wheel-venv
rm -rf "$venv"
"$PY" -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q --no-index --no-deps "$DDOTEST_WHEEL"
unset DDO_LIBRARY
export DDOTEST_INSTALLED=1 DDO_BIN="$venv/bin/ddo"
cd "$venv"  # no python/ (the source package) on sys.path
where=$("$venv/bin/python" -c "import ddo; print(ddo.library_version()[1])")
case "$where" in
    "$venv"/*) echo "installed: $where" ;;
    *) echo "FAIL: ddo loaded $where, not the installed wheel's library"; exit 1 ;;
esac
"$venv/bin/ddo" --help >/dev/null
"$venv/bin/python" -m ddo version
"$venv/bin/ddo" demo | tail -n 1
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$tests" "$tests"
