#!/usr/bin/env bash
# check_py_ffi.sh - python/ddo/_ffi.py (the binding's ctypes structs and function table) is
# exactly what python/tools/gen_ffi.py makes of the public headers, and no other module of the
# binding declares a libddo function's restype/argtypes by hand.
# ctest-labels: unit
set -u
SRC=${DDO_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$SRC" || exit 1
PY=${DDO_PYTHON:-/usr/bin/python3}
fails=0
"$PY" python/tools/gen_ffi.py --check || fails=1
# A ddo function's restype/argtypes set, or a "ddo_name": (restype, [...]) table entry, outside
# the generated file (the loader sets the two it calls before checking the version).
hits=$(grep -nE 'ddo_[a-z0-9_]+\.(restype|argtypes) *=|"ddo_[a-z0-9_]+": *\(' -- python/ddo/*.py \
    python/ddo/*/*.py python/*.py 2>/dev/null |
    grep -vE '^python/ddo/_ffi\.py:|^python/ddo/_lib\.py:.*lib\.(ddo_version_string|ddo_struct_size)\.' || true)
if [ -n "$hits" ]; then
    echo "FAIL: C declarations written by hand in the binding (regenerate python/ddo/_ffi.py):"
    echo "$hits"
    fails=1
fi
# Every public struct the generated file mirrors is one whose size the library reports
# (ddo_struct_size, src/base/abi.c): the binding checks each mirror's size at load.
for st in $(grep -ohE '^typedef struct (ddo_[a-z0-9_]+) \{' include/ddo.h include/ddo_host.h \
    include/ddo_compat.h | awk '{print $3}'); do
    grep -rqE "DDO_ABI_SIZE_\($st\)" src || {
        echo "FAIL: $st is a public struct but ddo_struct_size does not know it (src/base/abi.c)"
        fails=1
    }
done
[ "$fails" = 0 ] && echo "python ffi: generated from the public headers"
exit "$fails"
