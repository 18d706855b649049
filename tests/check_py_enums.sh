#!/usr/bin/env bash
# check_py_enums.sh - python/ddo/_enums.py (the binding's C constants) is exactly what
# python/tools/gen_enums.py makes of the public headers (include/ddo*.h), and the binding writes no enum value of
# its own beside it.
# ctest-labels: unit
set -u
SRC=${DDO_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$SRC" || exit 1
PY=${DDO_PYTHON:-/usr/bin/python3}
fails=0
"$PY" python/tools/gen_enums.py --check || fails=1
# A constant named after its C name beside a number ("X = 0  # DDO_...") is a hand copy.
hits=$(grep -nE '^[A-Z_]+ *= *-?[0-9]+ *# *DDO_|_PLACEMENT_[A-Z]+, .* = [0-9]' -- python/ddo/*.py python/ddo/*/*.py || true)
if [ -n "$hits" ]; then
    echo "FAIL: C values written by hand in the binding (use ddo._enums):"
    echo "$hits"
    fails=1
fi
[ "$fails" = 0 ] && echo "python enums: generated from the public headers"
exit "$fails"
