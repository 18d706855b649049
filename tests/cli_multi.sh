#!/usr/bin/env bash
# cli_multi.sh - device sets from the tool on the cpu device (docs/multi-gpu.md): `ddo plan`
# shows the set and its JSON keeps it, `ddo run` in donor mode (cpu:0 computes, cpu:1 stores)
# is verified bit-identical against the file, `ddo run` and `ddo bench` in split mode (cpu:0..2)
# are verified and every device compared with the first, a refused set names its option, and
# `ddo doctor --devices` measures the emulated links and refuses a name that is not a device.
# ctest-labels: cli
set -u
: "${DDO_BIN:?DDO_BIN is not set}"
T=$(mktemp -d "${TMPDIR:-/tmp}/ddo-cli-multi-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
pass() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; fails=$((fails + 1)); }
check() { if eval "$2"; then pass "$1"; else fail "$1"; fi; }

{
    echo '{"architecture": "cli-multi", "tensors": ['
    for i in 0 1 2 3 4 5; do
        echo "{\"name\": \"blocks.$i.attn.weight\", \"shape\": [256, 192], \"dtype\": \"BF16\"},"
        echo "{\"name\": \"blocks.$i.mlp.weight\", \"shape\": [192, 256], \"dtype\": \"F16\"},"
    done
    echo '{"name": "out.weight", "shape": [16, 64], "dtype": "BF16"}'
    echo ']}'
} >"$T/l.json"
"$DDO_BIN" synth --layout "$T/l.json" --out "$T/m.safetensors" --seed 3 >"$T/synth.log" 2>&1 ||
    { cat "$T/synth.log"; echo "FAIL: ddo synth"; exit 1; }
SET=(--ddo-devices cpu:0,cpu:1 --ddo-backend vmm --ddo-execution-mode vmm_fast_runtime
    --ddo-vmm-resident-weight-budget-gb 0.01 --ddo-resident-module-budget-gb 0
    --ddo-small-tensor-threshold-kb 16)

"$DDO_BIN" plan "$T/m.safetensors" "${SET[@]}" --ddo-peer-link-gbps 250 >"$T/plan.out" 2>&1; rc=$?
cat "$T/plan.out"
check "plan with a device set exits 0" '[ $rc -eq 0 ]'
check "plan shows the donor set, the store and the link" \
    'grep -q "device set *donor: cpu:0,cpu:1" "$T/plan.out" && grep -q "store device" "$T/plan.out" &&
     grep -q "device link *250.0 GB/s" "$T/plan.out"'
check "the donor plan keeps no host copy of the streamed units (they live on the store)" \
    'grep -qE "retained_store +none_donor" "$T/plan.out" && grep -qE "^  retained host +0.00 GiB" "$T/plan.out"'
"$DDO_BIN" plan "$T/m.safetensors" "${SET[@]}" --json >"$T/plan.json" 2>&1; rc=$?
check "the plan JSON has its device_set" \
    '[ $rc -eq 0 ] && grep -q "\"device_set\"" "$T/plan.json" && grep -q "\"mode\": \"donor\"" "$T/plan.json"'

"$DDO_BIN" run "$T/m.safetensors" "${SET[@]}" --steps 3 --tokens 4 --verify \
    --metrics "$T/m.jsonl" >"$T/run.out" 2>&1; rc=$?
cat "$T/run.out"
check "donor run exits 0, verified bit-identical" \
    '[ $rc -eq 0 ] && grep -q "store device: cpu:1 (donor mode)" "$T/run.out" &&
     grep -q "verify: OK: 3 steps bit-identical" "$T/run.out"'
check "the streamed bytes came from the store device" \
    'grep -oE "\"bytes_from_store\":[0-9]+" "$T/m.jsonl" | grep -qvE ":0$"'

"$DDO_BIN" plan "$T/m.safetensors" "${SET[@]}" --ddo-store-device-budget-gb 0.0001 >"$T/b.out" 2>&1
rc=$?
check "a store over its budget is refused naming store_device_budget_gb" \
    '[ $rc -ne 0 ] && grep -q "store_device_budget_gb" "$T/b.out"'
"$DDO_BIN" plan "$T/m.safetensors" "${SET[@]}" --ddo-execution-device cpu >"$T/e.out" 2>&1; rc=$?
check "an execution_device other than the set's first is refused" \
    '[ $rc -ne 0 ] && grep -q "first device" "$T/e.out"'

# `ddo bench` in donor mode: the store opened once, its link measured, every case bit-identical,
# the streamed bytes from the store and the bound taken at the link's rate.
"$DDO_BIN" bench "$T/m.safetensors" "${SET[@]}" --bus-gib 0.05 --direct-gib 0 --steps 2 \
    --json "$T/db.json" >"$T/dbench.out" 2>&1; rc=$?
cat "$T/dbench.out"
check "donor bench exits 0, the store and its link named, every case bit-identical" \
    '[ $rc -eq 0 ] && [ "$(grep -c "store device: cpu:1 (donor mode), link to the computing device [0-9.]* GB/s$" "$T/dbench.out")" -eq 1 ] &&
     grep -q "\"bit_identical\": true" "$T/db.json" && ! grep -q "\"bit_identical\": false" "$T/db.json" &&
     grep -qE "\"bytes_from_store\": [1-9]" "$T/db.json" && grep -qE "\"peer_bytes_per_s\": [1-9]" "$T/db.json"'
# Cases of both modes in one bench: each gets its mode's devices (the set reopened between them).
"$DDO_BIN" bench "$T/m.safetensors" "${SET[@]}" --bus-gib 0.05 --direct-gib 0 --steps 2 \
    --case donor --case "split --ddo-device-mode split --ddo-vmm-source-cache-gb 1" \
    --case donor_again --json "$T/mb.json" >"$T/mbench.out" 2>&1; rc=$?
check "a bench mixing donor and split cases runs each on its devices, bit-identical" \
    '[ $rc -eq 0 ] && [ "$(grep -c "\"bit_identical\": true" "$T/mb.json")" -eq 4 ] &&
     grep -q "split over 2 devices: 0 of [1-9]" "$T/mbench.out" &&
     [ "$(grep -c "\"bytes_from_store\"" "$T/mb.json")" -eq 2 ]'

# Split mode: one session over three cpu devices; every other device's bytes are compared with
# the first's after each acquire, and the streamed bytes arrived by split uploads.
SPLIT=(--ddo-devices cpu:0,cpu:1,cpu:2 --ddo-device-mode split --ddo-execution-mode linear_runtime
    --ddo-vmm-source-cache-gb 1 --ddo-vmm-resident-weight-budget-gb 0.01
    --ddo-resident-module-budget-gb 0 --ddo-small-tensor-threshold-kb 16)
"$DDO_BIN" plan "$T/m.safetensors" "${SPLIT[@]}" >"$T/splan.out" 2>&1; rc=$?
check "plan shows the split set and what every device holds" \
    '[ $rc -eq 0 ] && grep -q "device set *split: cpu:0,cpu:1,cpu:2 (3 devices; every device computes" "$T/splan.out" &&
     grep -q "every device .*resident .* + [0-9]* slots" "$T/splan.out"'
"$DDO_BIN" run "$T/m.safetensors" "${SPLIT[@]}" --steps 3 --tokens 4 --verify \
    --metrics "$T/sm.jsonl" >"$T/split.out" 2>&1; rc=$?
cat "$T/split.out"
check "split run exits 0, verified, every device equal to the first" \
    '[ $rc -eq 0 ] && grep -q "split devices: cpu:1,cpu:2" "$T/split.out" &&
     grep -q "verify: OK: 3 steps bit-identical" "$T/split.out" &&
     grep -qE "split: OK: 0 of [1-9][0-9]* tensor copies on 2 other devices" "$T/split.out"'
check "the streamed bytes came by split uploads" \
    'grep -oE "\"bytes_split_uploaded\":[0-9]+" "$T/sm.jsonl" | grep -qvE ":0$" &&
     grep -q "\"split_devices\":3" "$T/sm.jsonl"'
"$DDO_BIN" bench "$T/m.safetensors" "${SPLIT[@]}" --json "$T/sb.json" >"$T/sbench.out" 2>&1; rc=$?
check "split bench exits 0, every case's devices equal to the first" \
    '[ $rc -eq 0 ] && grep -q "split over 3 devices: 0 of [1-9][0-9]* tensor copies" "$T/sbench.out" &&
     grep -q "\"split_devices_identical\": true" "$T/sb.json" &&
     ! grep -q "\"split_devices_identical\": false" "$T/sb.json"'
DDO_TEST_CORRUPT=2 "$DDO_BIN" run "$T/m.safetensors" "${SPLIT[@]}" --steps 3 --tokens 4 \
    >"$T/split-bad.out" 2>&1; rc=$?
check "a bit flipped on the first device only fails the split check" \
    '[ $rc -eq 1 ] && grep -qE "split: FAILED: [1-9][0-9]* of" "$T/split-bad.out"'

"$DDO_BIN" doctor --devices cpu:0,cpu:1 --measure-mb 16 --json >"$T/doc.json" 2>/dev/null; rc=$?
check "doctor measures the emulated links" \
    '[ $rc -eq 0 ] && grep -q "\"device_to_device\"" "$T/doc.json" && grep -q "\"split_intake_bytes_per_s\"" "$T/doc.json"'

"$DDO_BIN" doctor --devices cpu:0,gpu:1 --measure-mb 16 >"$T/doc_bad.out" 2>&1; rc=$?
check "doctor refuses a set naming something that is not a device, with the device-spec text" \
    '[ $rc -ne 0 ] && grep -q "\"gpu:1\": unknown device (expected cpu, cpu:N, cuda or cuda:N)" "$T/doc_bad.out"'

[ "$fails" -eq 0 ] && echo "cli_multi: all passed" || echo "cli_multi: $fails failed"
[ "$fails" -eq 0 ]
