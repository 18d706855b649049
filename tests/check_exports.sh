#!/usr/bin/env bash
# check_exports.sh - the exported set of libddo.so (libddo.dll in a Windows build) is reviewed: the functions declared DDO_API
# in the public headers (include/ddo.h, ddo_host.h, ddo_compat.h), the names listed in src/ddo.map (the linker version script) and the
# dynamic symbols the built library defines are the same three sets.
# ctest-labels: unit
set -u
SRC=${DDO_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=${DDO_BUILD_DIR:-$SRC/build}
LIB=${DDO_LIBRARY:-$BUILD/libddo.so}
# A Windows build (mingw-w64): libddo.dll's export table, read with the mingw-w64 objdump.
[ -z "${DDO_LIBRARY:-}" ] && [ ! -f "$LIB" ] && [ -f "$BUILD/libddo.dll" ] && LIB=$BUILD/libddo.dll
cd "$SRC" || exit 1
case $LIB in
*.dll) tool=x86_64-w64-mingw32-objdump ;;
*) tool=nm ;;
esac
command -v $tool >/dev/null || { echo "skipped: no $tool (binutils)"; exit 77; }
[ -f "$LIB" ] || { echo "FAIL: $LIB not built"; exit 1; }
exports() {
    if [ "$tool" = nm ]; then
        nm -D --defined-only "$LIB" | awk '{print $3}' | grep -v '^DDO_0$' | sed 's/@.*//'
    else
        $tool -p "$LIB" | sed -n '/^\[Ordinal\/Name Pointer\] Table/,/^$/p' |
            sed -nE 's/^\s+\[ *[0-9]+\] ([A-Za-z_][A-Za-z0-9_]*)$/\1/p'
    fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
grep -ohE '^DDO_API [^(]*\bddo_[a-z0-9_]+\(' include/ddo.h include/ddo_host.h include/ddo_compat.h | grep -oE 'ddo_[a-z0-9_]+\($' |
    tr -d '(' | sort -u >"$tmp/header"
sed -n '/^global:/,/^local:/p' src/ddo.map | grep -oE '^ +ddo_[a-z0-9_]+;' | tr -d ' ;' |
    sort -u >"$tmp/map"
exports | sort -u >"$tmp/lib"
fails=0
if ! diff -u "$tmp/header" "$tmp/map" >"$tmp/d1"; then
    echo "FAIL: the DDO_API functions of include/ (-) and src/ddo.map (+) differ:"
    cat "$tmp/d1"
    fails=1
fi
if ! diff -u "$tmp/map" "$tmp/lib" >"$tmp/d2"; then
    echo "FAIL: src/ddo.map (-) and the symbols $LIB exports (+) differ:"
    cat "$tmp/d2"
    fails=1
fi
[ "$fails" = 0 ] && echo "exports: $(wc -l <"$tmp/map") functions, header = map = library"
exit "$fails"
