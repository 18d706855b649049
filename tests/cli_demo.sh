#!/usr/bin/env bash
# cli_demo.sh - `ddo demo` (forced onto the cpu device): synthesises, streams under a quarter
# of the model, verifies, prints the profile, exits 0 and leaves nothing behind; a failing
# demo also cleans up and exits 1.
# ctest-labels: cli
set -u
: "${DDO_BIN:?DDO_BIN is not set}"
T=$(mktemp -d "${TMPDIR:-/tmp}/ddo-cli-demo-XXXXXX")
trap 'rm -rf "$T"' EXIT
mkdir "$T/tmp" # the demo's TMPDIR: must be empty again afterwards
fails=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi; }

start=$(date +%s)
# A smaller scale than the default 0.15 keeps sanitizer builds quick; the code path is the same.
TMPDIR="$T/tmp" "$DDO_BIN" demo --device cpu --scale 0.06 >"$T/demo.out" 2>&1; rc=$?
out="$T/demo.out"
cat "$out"
elapsed=$(($(date +%s) - start))
check "demo exits 0" '[ $rc -eq 0 ]'
check "says what it does" 'grep -q "synthesise Flux.1-dev" "$out" && grep -q "device weight budget" "$out"'
check "plan summary before the steps" 'grep -q "^plan: route vmm_fast_runtime" "$out"'
check "the plan fits the budget it printed" 'grep -q "weights peak .* limit" "$out"'
check "two step rows" '[ "$(grep -cE "^ +[12] +[0-9.]+s" "$out")" -eq 2 ]'
check "verified" 'grep -q "verify: OK: 2 steps bit-identical" "$out" && grep -q "^ddo demo: OK" "$out"'
check "profile printed" 'grep -q "ddo-profile" "$out"'
check "temporary directory removed" '[ -z "$(ls -A "$T/tmp")" ]'
echo "demo took ${elapsed}s"

# A failure after the temporary directory exists still cleans up.
printf '{"tensors": [{"name": "x", "shape": [4], "dtype": "NOPE"}]}' >"$T/bad.json"
TMPDIR="$T/tmp" "$DDO_BIN" demo --device cpu --layout "$T/bad.json" >"$T/demo.out" 2>&1; rc=$?
cat "$T/demo.out"
check "a bad layout fails with exit 1" '[ $rc -eq 1 ]'
check "and leaves no temporary directory" '[ -z "$(ls -A "$T/tmp")" ]'
"$DDO_BIN" demo --bogus >/dev/null 2>&1; rc=$?
check "an unknown option is a usage error (2)" '[ $rc -eq 2 ]'

echo "$fails failed"
[ "$fails" -eq 0 ]
