#!/usr/bin/env bash
# Acceptance check of the Windows build: `ddo demo` of the Windows ddo.exe (run by the given
# command, e.g. the build's ddo-run.sh under Wine) prints OK, and its --verify checksum is the
# Linux build's for the same synthetic checkpoint (the demo's fixed seed and scale).
# Usage: tools/windows/check-demo.sh LINUX_DDO WINDOWS_DDO_COMMAND
set -euo pipefail
linux=${1:?usage: check-demo.sh LINUX_DDO WINDOWS_DDO_COMMAND}
windows=${2:?usage: check-demo.sh LINUX_DDO WINDOWS_DDO_COMMAND}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$linux" demo >"$out/linux.txt" 2>&1
TMPDIR=$out "$windows" demo >"$out/windows.txt" 2>&1
sum() { sed -n 's/^verify: OK: .*(\([0-9a-f]*\))$/\1/p' "$1"; }
l=$(sum "$out/linux.txt")
w=$(sum "$out/windows.txt")
grep -q "^ddo demo: OK:" "$out/windows.txt" || { echo "check-demo: ddo.exe demo did not print OK:"; tail -5 "$out/windows.txt"; exit 1; }
[ -n "$l" ] || { echo "check-demo: no checksum from the Linux demo"; tail -5 "$out/linux.txt"; exit 1; }
if [ "$l" != "$w" ]; then
    echo "check-demo: checksums differ: Linux $l, Windows ${w:-none}"
    exit 1
fi
echo "check-demo: ddo.exe demo OK, checksum $w = Linux's"
