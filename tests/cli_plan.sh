#!/usr/bin/env bash
# cli_plan.sh - `ddo synth` and `ddo plan` on every architecture layout in
# data/layouts: synthesised small (--scale), planned on the cpu device with a
# given device memory, the expected block groups found, the JSON round-trips,
# and the exit codes of usage errors and refused plans.
# ctest-labels: cli
set -u
DDO=${DDO_BIN:?DDO_BIN not set}
SRC=${DDO_SOURCE_DIR:?DDO_SOURCE_DIR not set}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# layout  expected "group:count" pairs
check_layout() {
    local name=$1
    shift
    local ck="$T/$name.safetensors"
    "$DDO" synth --layout "$SRC/data/layouts/$name.json" --out "$ck" --scale 0.05 --seed 7 \
        >"$T/synth.out" 2>&1 || { fail "$name: synth: $(cat "$T/synth.out")"; return; }
    # The header length (8 bytes, little-endian) is a multiple of 8.
    local hl
    hl=$(od -An -t u8 -N 8 "$ck" | tr -d ' ')
    [ $((hl % 8)) -eq 0 ] || fail "$name: header length $hl is not a multiple of 8"
    local flags=(--ddo-execution-device cpu --device-memory-gb 64 --host-memory-gb 32
        --ddo-small-tensor-threshold-kb 4 --ddo-resident-module-patterns auto)
    "$DDO" plan "$ck" "${flags[@]}" --json >"$T/$name.json" 2>"$T/err" ||
        { fail "$name: plan --json: $(cat "$T/err")"; return; }
    for pair in "$@"; do
        local group=${pair%%:*} count=${pair##*:} got
        # blocks in units of their own or packed ("group.A-B", unit_pack_blocks)
        got=$(grep -oE "^      \"name\": \"$group\.[0-9]+(-[0-9]+)?\",$" "$T/$name.json" |
            sed -E 's/.*\.([0-9]+)(-([0-9]+))?",$/\1 \3/' |
            awk '{ n += ($2 == "" ? 1 : $2 - $1 + 1) } END { print n + 0 }')
        [ "$got" -eq "$count" ] || fail "$name: $group: $got blocks in units, expected $count"
        grep -qF "\"^$group\\\\.\\\\d+\$\"" "$T/$name.json" ||
            fail "$name: auto did not expand to ^$group\\.\\d+\$"
    done
    # JSON -> plan -> JSON is identical.
    "$DDO" plan --from-json "$T/$name.json" --json >"$T/$name.2.json" 2>"$T/err" ||
        fail "$name: --from-json: $(cat "$T/err")"
    cmp -s "$T/$name.json" "$T/$name.2.json" || fail "$name: JSON did not round-trip"
    # The table names the route, the budgets and the decisions.
    "$DDO" plan "$ck" "${flags[@]}" --bandwidth-gbps 55 --tflops 790 >"$T/$name.txt" 2>&1 ||
        fail "$name: plan table: $(cat "$T/$name.txt")"
    for want in "route: " "device weights" "retained host" "registered host" "staging" \
        "predicted step" "decisions:" "transfer ms"; do
        grep -qF "$want" "$T/$name.txt" || fail "$name: table lacks '$want'"
    done
}

check_layout flux1-dev transformer_blocks:19 single_transformer_blocks:38
check_layout ltx-video-13b transformer_blocks:48
check_layout sd3.5-large transformer_blocks:38
check_layout wan2.1-t2v-14b blocks:40
check_layout qwen-image transformer_blocks:60

ck="$T/flux1-dev.safetensors"
# Same layout, scale and seed give the same bytes; another seed gives other bytes.
"$DDO" synth --layout "$SRC/data/layouts/flux1-dev.json" --out "$T/again.safetensors" \
    --scale 0.05 --seed 7 >/dev/null || fail "synth again"
cmp -s "$ck" "$T/again.safetensors" || fail "synth is not deterministic"
"$DDO" synth --layout "$SRC/data/layouts/flux1-dev.json" --out "$T/other.safetensors" \
    --scale 0.05 --seed 8 >/dev/null || fail "synth seed 8"
cmp -s "$ck" "$T/other.safetensors" && fail "a different seed gave the same bytes"
# The bytes do not depend on the generator's thread count (uniform and normal values; a
# scale whose tensors cross the generator's 8 MiB pieces at odd offsets).
for values in uniform normal; do
    for th in 1 2 5; do
        "$DDO" synth --layout "$SRC/data/layouts/flux1-dev.json" --out "$T/th$th.safetensors" \
            --scale 0.07 --seed 7 --values "$values" --threads "$th" >/dev/null ||
            fail "synth --values $values --threads $th"
    done
    cmp -s "$T/th1.safetensors" "$T/th2.safetensors" || fail "synth $values: 1 and 2 threads differ"
    cmp -s "$T/th1.safetensors" "$T/th5.safetensors" || fail "synth $values: 1 and 5 threads differ"
done
"$DDO" synth --layout "$SRC/data/layouts/flux1-dev.json" --out "$T/th0.safetensors" --threads 0 \
    >/dev/null 2>&1 && fail "synth --threads 0 accepted"

# Without a device limit (an explicit device that does not open: the plan is made without its
# figures) the plan says so.
"$DDO" plan "$ck" --ddo-execution-device cuda:63 --host-memory-gb 32 >"$T/nolimit.txt" 2>&1 ||
    fail "plan without a device limit"
# The cpu device, as `ddo run` would open it: its memory is the limit, and a model that fits
# streams nothing; the default cuda:0 stands down to it where no GPU answers, said on stderr.
"$DDO" plan "$ck" --ddo-execution-device cpu >"$T/cpu.txt" 2>&1 || fail "plan on the cpu device"
grep -qF "the whole model fits the device budget: nothing streams" "$T/cpu.txt" ||
    fail "cpu device plan: $(grep -E "fits|device weights" "$T/cpu.txt")"
grep -qE "device weights .* / [0-9.]+ GiB .*limit: device memory" "$T/cpu.txt" ||
    fail "cpu device plan has no device limit"
"$DDO" run "$ck" --ddo-execution-device cpu --steps 1 >"$T/cpurun.txt" 2>&1 || fail "run on the cpu device"
grep -qE "tensors +[0-9]+ resident, 0 streamed" "$T/cpurun.txt" || fail "run streams where plan did not"
grep -qF "no device limit known" "$T/nolimit.txt" || fail "no-limit plan does not say so"
grep -qF "cost model off" "$T/nolimit.txt" || fail "cost model off is not explained"

# A plan over budget is refused: exit 1, one line on stderr, nothing on stdout.
"$DDO" plan "$ck" --ddo-execution-device cpu --ddo-small-tensor-threshold-kb 4 \
    --ddo-vmm-resident-weight-budget-gb 0.001 >"$T/out" 2>"$T/err"
rc=$?
[ "$rc" -eq 1 ] || fail "over-budget plan: exit $rc, expected 1"
[ -s "$T/out" ] && fail "over-budget plan printed on stdout"
[ "$(wc -l <"$T/err")" -eq 1 ] || fail "over-budget plan: stderr is not one line"
grep -qF "is too small for any plan: unit" "$T/err" || fail "over-budget message: $(cat "$T/err")"

# Usage errors: exit 2.
"$DDO" plan >/dev/null 2>&1
[ $? -eq 2 ] || fail "plan without PATH should exit 2"
"$DDO" plan "$ck" --tflops nope >/dev/null 2>&1
[ $? -eq 2 ] || fail "plan --tflops nope should exit 2"
"$DDO" synth --layout "$SRC/data/layouts/flux1-dev.json" >/dev/null 2>&1
[ $? -eq 2 ] || fail "synth without --out should exit 2"
"$DDO" synth --layout "$SRC/data/layouts/flux1-dev.json" --out "$T/x" --scale 2 >/dev/null 2>&1
[ $? -eq 2 ] || fail "synth --scale 2 should exit 2"
"$DDO" synth --layout "$T/missing.json" --out "$T/x" >/dev/null 2>&1
[ $? -eq 1 ] || fail "synth of a missing layout should exit 1"
[ -e "$T/x" ] && fail "a failed synth left its output behind"

if [ "$fails" -ne 0 ]; then
    echo "$fails failure(s)"
    exit 1
fi
echo "cli_plan: all checks passed"
