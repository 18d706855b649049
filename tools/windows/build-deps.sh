#!/usr/bin/env bash
# Cross-builds jansson and PCRE2 (8-bit, no JIT) for 64-bit Windows with mingw-w64 into a prefix,
# from Debian's own source packages (apt-get source), static libraries only. Debian ships no
# mingw builds of either. Usage: tools/windows/build-deps.sh PREFIX
# Reuses PREFIX when it already holds both (a cache in the build tree; never committed).
set -euo pipefail
prefix=${1:?usage: build-deps.sh PREFIX}
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
if [ -f "$prefix/lib/libjansson.a" ] && [ -f "$prefix/lib/libpcre2-8.a" ]; then
    echo "build-deps: $prefix already has jansson and PCRE2"
    exit 0
fi
work="$prefix/src"
mkdir -p "$work/apt/lists/partial"
cd "$work"
# A deb-src list of our own, so /etc/apt stays as it is.
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
echo "deb-src http://deb.debian.org/debian $codename main" >"$work/apt/sources.list"
apto=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$work/apt/lists")
apt-get "${apto[@]}" update -qq
apt-get "${apto[@]}" source --download-only jansson pcre2 >/dev/null
tar xzf jansson_*.orig.tar.gz
tar xzf pcre2_*.orig.tar.gz
tc="$here/mingw-w64-x86_64.cmake"
jobs=${DDO_JOBS:-2}
common=(-DCMAKE_TOOLCHAIN_FILE="$tc" -DDDO_MINGW_PREFIX="$prefix" -DCMAKE_INSTALL_PREFIX="$prefix"
    -DCMAKE_BUILD_TYPE=Release)
js=$(ls -d jansson-*/ | head -1)
cmake -S "$js" -B "$js/b" "${common[@]}" -DJANSSON_BUILD_DOCS=OFF -DJANSSON_BUILD_SHARED_LIBS=OFF \
    -DJANSSON_EXAMPLES=OFF -DJANSSON_WITHOUT_TESTS=ON >/dev/null
cmake --build "$js/b" -j "$jobs" >/dev/null
cmake --install "$js/b" >/dev/null
ps=$(ls -d pcre2-*/ | head -1)
cmake -S "$ps" -B "$ps/b" "${common[@]}" -DBUILD_SHARED_LIBS=OFF -DPCRE2_BUILD_PCRE2_8=ON \
    -DPCRE2_BUILD_PCRE2_16=OFF -DPCRE2_BUILD_PCRE2_32=OFF -DPCRE2_SUPPORT_JIT=OFF \
    -DPCRE2_BUILD_PCRE2GREP=OFF -DPCRE2_BUILD_TESTS=OFF -DPCRE2_SUPPORT_LIBBZ2=OFF \
    -DPCRE2_SUPPORT_LIBZ=OFF -DPCRE2_SUPPORT_LIBREADLINE=OFF -DPCRE2_SUPPORT_LIBEDIT=OFF >/dev/null
cmake --build "$ps/b" -j "$jobs" >/dev/null
cmake --install "$ps/b" >/dev/null
echo "build-deps: jansson and PCRE2 installed in $prefix"
