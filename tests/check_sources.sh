#!/usr/bin/env bash
# check_sources.sh - CMakeLists.txt names every source, test and script explicitly (no file(GLOB)):
# this fails on a file that is in the tree but not in its list, so a new file (or one a merge
# brought) is never silently left out of the build or the suite; and on a file that defines
# its own feature macros (_GNU_SOURCE, _POSIX_C_SOURCE: CMakeLists.txt sets them once).
# ctest-labels: unit
set -euo pipefail
cd "${DDO_SOURCE_DIR:-$(dirname "$0")/..}"
lists=CMakeLists.txt
missing=0
need() { # need WORD FILE: WORD must appear in CMakeLists.txt as a whole word
    if ! grep -qE "(^|[ (/])$1([ )]|$)" "$lists"; then
        echo "FAIL: $2 is not listed in $lists"
        missing=$((missing + 1))
    fi
}
if grep -n 'file(GLOB' "$lists"; then
    echo "FAIL: $lists globs files; list them"
    missing=$((missing + 1))
fi
for f in $(cd src && find . -name '*.c' | sed 's|^\./||' | sort); do need "$f" "src/$f"; done
for f in tools/ddo/*.c; do need "$(basename "$f")" "$f"; done
for f in tests/test_*.c bench/bench_*.c tests/cli_*.sh tests/check_*.sh; do
    b=$(basename "$f"); need "${b%.*}" "$f"
done
for f in tests/fuzz/fuzz_*.c; do b=$(basename "$f" .c); need "${b#fuzz_}" "$f"; done
# Feature macros are set once, by CMake (add_compile_definitions), never by a file.
if git_files=$(grep -lE '^#\s*(define|undef)\s+(_GNU_SOURCE|_POSIX_C_SOURCE|_DEFAULT_SOURCE|_XOPEN_SOURCE)\b' \
    $(find src tools tests bench examples -name '*.[ch]' 2>/dev/null)); then
    echo "FAIL: feature macros defined in files (CMakeLists.txt sets them once):"
    echo "$git_files"
    missing=$((missing + 1))
fi
[ "$missing" -eq 0 ] || exit 1
echo "ok: every source, test and script is listed in $lists"
