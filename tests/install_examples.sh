#!/usr/bin/env bash
# install_examples.sh - `cmake --install` of this build into a fresh prefix holds the three public
# headers (and no private one), libddo, the tool, ddo.pc and the CMake package (ddoConfig.cmake,
# its version file, the exported target ddo::ddo); the C examples (examples/*.c) build against
# that prefix with pkg-config and with find_package(ddo), and run; each public header compiles
# on its own, as C11 and, when a C++ compiler is there, as C++. CTest runs it after the build
# (not in sanitizer or cross builds); .ci/run runs it too.
# ctest-labels: unit
set -eu
SRC=${DDO_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=${DDO_BUILD_DIR:-$SRC/build}
CC=${DDO_CC:-cc}
command -v pkg-config >/dev/null || { echo "skipped: no pkg-config"; exit 77; }
[ -f "$BUILD/cmake_install.cmake" ] || { echo "FAIL: $BUILD is not a configured build"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$BUILD" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; exit 1; }
lib=$(find "$prefix" -name 'libddo.so' | head -n 1)
[ -n "$lib" ] || { echo "FAIL: no libddo.so installed under $prefix"; exit 1; }
libdir=$(dirname "$lib")
fails=0
for f in include/ddo.h include/ddo_host.h include/ddo_compat.h bin/ddo; do
    [ -f "$prefix/$f" ] || { echo "FAIL: $f not installed"; fails=1; }
done
for f in pkgconfig/ddo.pc cmake/ddo/ddoConfig.cmake cmake/ddo/ddoConfigVersion.cmake \
    cmake/ddo/ddoTargets.cmake; do
    [ -f "$libdir/$f" ] || { echo "FAIL: ${libdir#"$prefix"/}/$f not installed"; fails=1; }
done
extra=$(cd "$prefix/include" && ls | grep -vxE 'ddo\.h|ddo_host\.h|ddo_compat\.h' || true)
[ -z "$extra" ] || { echo "FAIL: headers installed beyond the public three: $extra"; fails=1; }
[ "$fails" = 0 ] || exit 1

# Each public header on its own (C11 with the build's warnings; C++ when there is a compiler).
for h in ddo.h ddo_host.h ddo_compat.h; do
    echo "#include <$h>" | "$CC" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only \
        -I"$prefix/include" -x c - || { echo "FAIL: $h does not compile on its own (C)"; fails=1; }
    if command -v c++ >/dev/null; then
        echo "#include <$h>" | c++ -std=c++11 -Wall -Wextra -Werror -fsyntax-only \
            -I"$prefix/include" -x c++ - || { echo "FAIL: $h does not compile as C++"; fails=1; }
    fi
done

export PKG_CONFIG_PATH=$libdir/pkgconfig
n=0
for ex in "$SRC"/examples/*.c; do
    name=$(basename "$ex" .c)
    # shellcheck disable=SC2046
    "$CC" -std=c11 -Wall -Wextra -Werror "$ex" $(pkg-config --cflags --libs ddo) \
        -Wl,-rpath,"$libdir" -o "$tmp/$name-pc" || { echo "FAIL: $name (pkg-config)"; fails=1; continue; }
    "$tmp/$name-pc" || { echo "FAIL: $name built with pkg-config exited $?"; fails=1; }
    n=$((n + 1))
done
cmake -S "$SRC/examples" -B "$tmp/ex" -DCMAKE_C_COMPILER="$CC" -DCMAKE_PREFIX_PATH="$prefix" \
    >"$tmp/ex.log" 2>&1 && cmake --build "$tmp/ex" >>"$tmp/ex.log" 2>&1 ||
    { cat "$tmp/ex.log"; echo "FAIL: examples/ with find_package(ddo)"; exit 1; }
for ex in "$SRC"/examples/*.c; do
    name=$(basename "$ex" .c)
    "$tmp/ex/$name" || { echo "FAIL: $name built with find_package(ddo) exited $?"; fails=1; }
done
[ "$fails" = 0 ] && echo "install: $prefix holds the API; $n example(s) built with pkg-config and find_package(ddo), and ran"
exit "$fails"
