#!/usr/bin/env bash
# cli_budget.sh - a device budget is used, with nothing else given: a Flux layout scaled to
# 0.24 GB under a 0.1 GiB budget fills it (peak within the budget) and runs bit-identical to
# the direct-read reference; a 24 MiB model under 4 GiB is all resident, the plan says so in
# one line, and runs bit-identical; the budget's two names, a budget above the device and a
# device limit above the device, refused or capped with the messages a user reads; with nothing
# given the activation reserve is estimated, activation_reserve_gb (a measured one) replaces it.
# ctest-labels: cli
set -u
: "${DDO_BIN:?DDO_BIN is not set}"
: "${DDO_SOURCE_DIR:?DDO_SOURCE_DIR is not set}"
T=$(mktemp -d "${TMPDIR:-/tmp}/ddo-cli-budget-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
pass() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; fails=$((fails + 1)); }
check() { if eval "$2"; then pass "$1"; else fail "$1"; fi; }
FLUX="$DDO_SOURCE_DIR/data/layouts/flux1-dev.json"
synth() { # synth SCALE OUT
    "$DDO_BIN" synth --layout "$FLUX" --out "$2" --scale "$1" --seed 7 >"$T/synth.log" 2>&1 ||
        { cat "$T/synth.log"; echo "FAIL: ddo synth"; exit 1; }
}
synth 0.1 "$T/flux.safetensors"
synth 0.032 "$T/small.safetensors"
CPU=(--ddo-execution-device cpu)

# A scaled Flux (0.24 GB) under 0.1 GiB: the budget filled with resident blocks, the rest
# streamed, the run bit-identical, the device peak within the budget.
"$DDO_BIN" plan "$T/flux.safetensors" "${CPU[@]}" --ddo-device-budget-gb 0.1 --json \
    >"$T/flux.json" 2>"$T/flux.err"; rc=$?
check "scaled Flux under 0.1 GiB plans (exit $rc: $(head -c 300 "$T/flux.err"))" '[ $rc -eq 0 ]'
/usr/bin/python3 - "$T/flux.json" >"$T/flux.check" 2>&1 <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
dw = p["budgets"]["device_weights"]
limit = int(0.1 * 2**30)
units = p["units"]
res = [u for u in units if u["resident"]]
assert dw["peak"] <= limit == dw["limit"], dw
largest = max(u["span_bytes"] for u in units)
assert dw["peak"] + largest >= limit, (dw, largest)
assert res and len(res) < len(units), (len(res), len(units))
assert p["planner_decisions"]["resident_set_rule"].startswith("fill"), p["planner_decisions"]
print("ok", dw["peak"], len(res), len(units))
EOF
check "scaled Flux: peak within one unit of 0.1 GiB, some blocks resident ($(cat "$T/flux.check" | tail -1))" \
    'grep -q "^ok" "$T/flux.check"'
"$DDO_BIN" run "$T/flux.safetensors" "${CPU[@]}" --ddo-device-budget-gb 0.1 --steps 2 --tokens 5 \
    --verify >"$T/flux.run" 2>&1; rc=$?
check "scaled Flux under 0.1 GiB runs bit-identical (exit $rc)" \
    '[ $rc -eq 0 ] && grep -q "^verify: OK: 2 steps bit-identical" "$T/flux.run"'

# A 24 MiB model under 4 GiB: nothing streams, one line says so, the run is bit-identical.
"$DDO_BIN" plan "$T/small.safetensors" "${CPU[@]}" --ddo-device-budget-gb 4 >"$T/small.plan" 2>&1
check "24 MiB under 4 GiB: nothing streams" 'grep -q "^  streamed  0 " "$T/small.plan"'
check "24 MiB under 4 GiB: the plan says so in one line" \
    'sed -n 3p "$T/small.plan" | grep -qx "the whole model fits the device budget: nothing streams"'
"$DDO_BIN" run "$T/small.safetensors" "${CPU[@]}" --ddo-vmm-resident-weight-budget-gb 4 --steps 2 \
    --tokens 5 --verify >"$T/small.run" 2>&1; rc=$?
check "24 MiB under 4 GiB (the older name) runs bit-identical (exit $rc)" \
    '[ $rc -eq 0 ] && grep -q "^verify: OK: 2 steps bit-identical" "$T/small.run"'

# weight_codec=ddoc1 under the same budget: the decode areas are held back before the resident
# set is chosen, so the plan fits with them (no refusal) and the run stays bit-identical.
"$DDO_BIN" plan "$T/flux.safetensors" "${CPU[@]}" --ddo-backend vmm --ddo-vmm-source-cache-gb 1 \
    --ddo-device-budget-gb 0.1 --ddo-weight-codec ddoc1 >"$T/codec.plan" 2>&1; rc=$?
check "ddoc1 under 0.1 GiB plans with its decode areas held back (exit $rc)" \
    '[ $rc -eq 0 ] && grep -q "fill_codec_reserve_gb" "$T/codec.plan" && grep -q "codec_decode_area_gb" "$T/codec.plan"'

# Bad input: two budgets, an explicit 0, a budget too small for any plan, a device limit
# above the device.
"$DDO_BIN" plan "$T/small.safetensors" "${CPU[@]}" --ddo-device-budget-gb 2 \
    --ddo-vmm-resident-weight-budget-gb 3 >/dev/null 2>"$T/err"; rc=$?
check "two different budgets are refused naming both" \
    '[ $rc -eq 1 ] && grep -qF "device_budget_gb=2 and vmm_resident_weight_budget_gb=3" "$T/err"'
"$DDO_BIN" plan "$T/small.safetensors" "${CPU[@]}" --ddo-device-budget-gb 0 >/dev/null 2>"$T/err"
check "an explicit budget of 0 is refused" 'grep -qF "device_budget_gb=0: a device budget must be positive" "$T/err"'
"$DDO_BIN" plan "$T/flux.safetensors" "${CPU[@]}" --ddo-device-budget-gb 0.001 >/dev/null 2>"$T/err"
check "a budget below two units names the unit and the smallest budget, in MiB" \
    'grep -qE "device budget 1\.0[0-9] MiB \(device_budget_gb\) is too small for any plan: unit \"[a-z_.0-9]+\" takes [0-9.]+ MiB .* smallest budget that works is [0-9.]+ MiB" "$T/err" && ! grep -q "0\.00 GiB" "$T/err"'
"$DDO_BIN" plan "$T/small.safetensors" "${CPU[@]}" --device-memory-gb 8 \
    --ddo-device-memory-limit-gb 16 >/dev/null 2>"$T/err"
check "a device limit above the device is refused with its size" \
    'grep -qF "device_memory_limit_gb=16 is above the device'"'"'s memory (8.00 GiB)" "$T/err"'
"$DDO_BIN" plan "$T/small.safetensors" "${CPU[@]}" --device-memory-gb 8 \
    --ddo-device-budget-gb 16 >"$T/out" 2>&1
check "a budget above the device is capped with a note" \
    'grep -qF "device_budget_gb 16.00 GiB is above the device memory 8.00 GiB: capped to it" "$T/out"'
# Sized from the device: the activation reserve estimated from the plan's units, or the one a
# host measured on the first forward (activation_reserve_gb, which the Python binding sets).
"$DDO_BIN" plan "$T/small.safetensors" "${CPU[@]}" --device-memory-gb 8 --json >"$T/est.json" 2>&1
check "with nothing given the activation reserve is estimated from the plan's units" \
    'grep -qF "\"device_activation_reserve_source\": \"estimated from the plan'"'"'s units\"" "$T/est.json"'
"$DDO_BIN" plan "$T/small.safetensors" "${CPU[@]}" --device-memory-gb 8 \
    --ddo-activation-reserve-gb 0.3 --json >"$T/meas.json" 2>&1
check "activation_reserve_gb is the reserve measured on the first forward" \
    'grep -qF "device memory 8.00 GiB minus 307.20 MiB activation reserve measured on the first forward" "$T/meas.json" && grep -qF "\"device_activation_reserve_gb\": 0.3," "$T/meas.json"'
"$DDO_BIN" plan "$T/small.safetensors" "${CPU[@]}" --device-memory-gb 8 \
    --ddo-activation-reserve-gb 0.3 --ddo-auto-vram-headroom-gb 2 --json >"$T/head.json" 2>&1
check "auto_vram_headroom_gb wins over activation_reserve_gb" \
    'grep -qF "minus 2.00 GiB auto VRAM headroom" "$T/head.json"'

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all passed"
