#!/usr/bin/env bash
# check_version.sh - the version is written once, in include/ddo.h (DDO_VERSION_MAJOR, _MINOR,
# _PATCH): CMake, the wheel's backend and the Python package read it from there, so no build
# or package file may spell it out again.
# ctest-labels: unit
set -u
SRC=${DDO_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$SRC" || exit 1
v() { sed -nE "s/^#define DDO_VERSION_$1 +([0-9]+)$/\\1/p" include/ddo.h; }
ver="$(v MAJOR).$(v MINOR).$(v PATCH)"
case $ver in
[0-9]*.[0-9]*.[0-9]*) ;;
*) echo "FAIL: no DDO_VERSION_MAJOR/MINOR/PATCH in include/ddo.h"; exit 1 ;;
esac
re=$(printf '%s' "$ver" | sed 's/\./\\./g')
# shellcheck disable=SC2046
hits=$(grep -nE "(^|[^0-9.])$re([^0-9]|$)" -- CMakeLists.txt python/pyproject.toml \
    python/build_backend/*.py python/ddo/*.py include/ddo.h 2>/dev/null || true)
if [ -n "$hits" ]; then
    echo "FAIL: the version $ver written outside DDO_VERSION_MAJOR/MINOR/PATCH:"
    echo "$hits"
    exit 1
fi
echo "version $ver: written once (include/ddo.h)"
