#!/usr/bin/env bash
# The win_amd64 wheel: it holds ddo/libddo.dll and ddo/bin/ddo.exe (and no Linux library), its
# WHEEL file says win_amd64, a C program loads the DLL from the unpacked wheel by path and calls
# ddo_version_string (tests/windows/dll_load.c), and the wheel's ddo.exe prints its version,
# both under Wine (WINE, default wine; the caller's WINEPREFIX).
# Usage: tools/windows/check-wheel.sh WHEEL DLL_LOAD_EXE
#        tools/windows/check-wheel.sh --build-dir BUILD DLL_LOAD_EXE   (packs BUILD's wheel first)
set -euo pipefail
usage="usage: check-wheel.sh WHEEL|--build-dir BUILD DLL_LOAD_EXE"
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${DDO_PYTHON:-/usr/bin/python3}
wine=${WINE:-wine}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ "${1:-}" = --build-dir ]; then
    build=${2:?$usage}
    shift 2
    wheel=$("$py" "$root/python/build_backend/ddo_build.py" --platform win_amd64 \
        --build-dir "$build" --out "$out/dist" | tail -n 1)
else
    wheel=${1:?$usage}
    shift
fi
loader=${1:?$usage}
version=$(sed -n 's/^#define DDO_VERSION_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\)$/\2/p' \
    "$root/include/ddo.h" | paste -sd.)
case "$(basename "$wheel")" in
    ddo-"$version"-py3-none-win_amd64.whl) ;;
    *) echo "check-wheel: $wheel is not ddo-$version-py3-none-win_amd64.whl"; exit 1 ;;
esac
"$py" - "$wheel" "$out/w" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = set(z.namelist())
need = {"ddo/libddo.dll", "ddo/bin/ddo.exe", "ddo/__init__.py", "ddo/_lib.py"}
missing = sorted(need - names)
linux = sorted(n for n in names if n.endswith(".so") or n == "ddo/bin/ddo")
wheel = [z.read(n).decode() for n in names if n.endswith(".dist-info/WHEEL")]
if missing or linux or not wheel or "Tag: py3-none-win_amd64" not in wheel[0]:
    sys.exit(f"check-wheel: missing {missing}, Linux files {linux}, WHEEL {wheel}")
for n in ("ddo/libddo.dll", "ddo/bin/ddo.exe"):
    if z.read(n)[:2] != b"MZ":
        sys.exit(f"check-wheel: {n} is not a Windows executable")
z.extractall(sys.argv[2])
PY
winpath() { printf 'Z:%s' "${1//\//\\}"; }
cp "$loader" "$out/dll_load.exe" # away from the build's own libddo.dll
got=$("$wine" "$out/dll_load.exe" "$(winpath "$out/w/ddo/libddo.dll")" 2>&1) || {
    echo "check-wheel: dll_load could not use the wheel's DLL: $got"
    exit 1
}
case "$got" in
    *"libddo.dll: ddo $version, ddo_config_create: 0"*) ;;
    *) echo "check-wheel: unexpected dll_load output: $got"; exit 1 ;;
esac
tool=$("$wine" "$out/w/ddo/bin/ddo.exe" version 2>&1 | tr -d '\r')
[ "$tool" = "ddo $version" ] || { echo "check-wheel: the wheel's ddo.exe says: $tool"; exit 1; }
echo "check-wheel: $(basename "$wheel"): the DLL loads by path and says $version; ddo.exe too"
