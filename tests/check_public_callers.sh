#!/usr/bin/env bash
# check_public_callers.sh - every public function (src/ddo.map) is called by a host in the
# repository: the tool (tools/ddo: a call "name("), the Python binding or a Python example (a
# use ".name", as ctypes reaches a function), or an example in C. Tests do not count. The
# exceptions are listed, each with its reason, in tests/public_callers.txt.
# ctest-labels: unit
set -u
SRC=${DDO_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$SRC" || exit 1
list=tests/public_callers.txt
c_files=$(ls tools/ddo/*.c examples/*.c 2>/dev/null)
py_files=$(ls python/ddo/*.py python/ddo/*/*.py python/*.py examples/*.py 2>/dev/null)
names=$(sed -n '/^global:/,/^local:/p' src/ddo.map | grep -oE '^ +ddo_[a-z0-9_]+;' | tr -d ' ;')
[ -n "$names" ] || { echo "FAIL: no names in src/ddo.map"; exit 1; }
fails=0 n=0 listed=0
for f in $names; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    if grep -qE "\\b$f\\(" $c_files /dev/null || grep -qE "\\.$f\\b" $py_files /dev/null; then
        called=1
    else
        called=0
    fi
    reason=$(awk -F'\t' -v k="$f" '$1 == k { print $2 }' "$list")
    if [ "$called" = 0 ] && [ -z "$reason" ]; then
        echo "FAIL: $f has no caller in tools/, python/ or examples/ and no reason in $list"
        fails=1
    elif [ "$called" = 1 ] && [ -n "$reason" ]; then
        echo "FAIL: $f is listed in $list but now has a caller: drop its line"
        fails=1
    elif [ -n "$reason" ]; then
        listed=$((listed + 1))
    fi
done
for k in $(grep -vE '^(#|$)' "$list" | cut -f1); do
    echo "$names" | grep -qx "$k" || { echo "FAIL: $list names $k, which is not public"; fails=1; }
done
[ "$fails" = 0 ] && echo "public callers: $((n - listed)) of $n called by a host, $listed listed with reasons"
exit "$fails"
