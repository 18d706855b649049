#!/usr/bin/env bash
# `ddo bench` on the cpu device: the limits, the resident run and two cases, the table, the
# JSON (every case bit-identical to the resident run, peaks within the plan) and a valid
# Chrome trace; usage errors exit 2.
# ctest-labels: cli
set -u
pass=0; fail=0
check() { if eval "$1"; then pass=$((pass + 1)); echo "ok: $2"; else fail=$((fail + 1)); echo "FAILED: $2"; fi; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
ck="$DDO_TEST_DATA/safetensors/tiny_flux/diffusion_pytorch_model.safetensors"

"$DDO_BIN" bench "$ck" --ddo-execution-device cpu --ddo-small-tensor-threshold-kb 0 \
    --tokens 8 --steps 2 --trace-steps 1 --cpu-gbps 2 \
    --case "vmm --ddo-backend vmm --ddo-preset auto --ddo-vmm-source-cache-gb 1" \
    --case "linear --ddo-backend linear --ddo-preset auto --steps 3" \
    --json "$dir/b.json" --trace "$dir/t.json" >"$dir/out" 2>"$dir/err"; rc=$?
check '[ $rc -eq 0 ]' "bench exits 0"
check 'grep -q "^limits: bus 2.00 GB/s (cpu device throttle)" "$dir/out"' "bus limit from the cpu throttle"
check 'grep -q "^case           route  *step s  *bound s  *ratio" "$dir/out"' "table header"
check 'grep -Eq "^resident +one_shot_fast .* ok +yes$" "$dir/out"' "resident row"
check 'grep -Eq "^vmm +vmm_fast_runtime .* ok +yes$" "$dir/out"' "vmm row: peak ok, bit-identical"
check 'grep -Eq "^linear +one_shot_fast .* ok +yes$" "$dir/out"' "linear row: peak ok, bit-identical"
check '[ $(grep -c "\"bit_identical\": true" "$dir/b.json") -eq 3 ]' "json: three cases bit-identical"
check 'grep -q "\"schema\": \"ddo-bench/1\"" "$dir/b.json"' "json schema"
check 'grep -q "\"steps\": 3" "$dir/b.json"' "a case's own --steps"
check 'grep -q "\"peak_ok\": false" "$dir/b.json"; [ $? -ne 0 ]' "json: no peak over the plan"
if command -v python3 >/dev/null; then
    check 'python3 -c "import json,sys; t=json.load(open(sys.argv[1])); ev=t[\"traceEvents\"]; assert any(e[\"ph\"]==\"X\" and e.get(\"cat\")==\"acquire\" for e in ev); assert any(e[\"ph\"]==\"C\" for e in ev)" "$dir/t.json"' "trace: valid JSON with acquire spans and counters"
fi
check 'head -c 40 "$dir/t.json" | grep -q "traceEvents"' "trace file written"

"$DDO_BIN" bench >"$dir/out" 2>"$dir/err"; rc=$?
check '[ $rc -eq 2 ]' "no checkpoint: usage error"
check 'grep -q "give a checkpoint PATH or --layout FILE" "$dir/err"' "says what is missing"
"$DDO_BIN" bench "$ck" --case "--bad" >"$dir/out" 2>"$dir/err"; rc=$?
check '[ $rc -eq 2 ]' "a case without a name: usage error"
"$DDO_BIN" bench "$ck" --ddo-execution-device cpu --case "x --ddo-no-such-flag 1" --no-resident \
    >"$dir/out" 2>"$dir/err"; rc=$?
check '[ $rc -eq 1 ]' "a case with an unknown flag fails"
check 'grep -q "case x: " "$dir/err"' "names the case"
"$DDO_BIN" bench --help >"$dir/out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "^usage: ddo bench" "$dir/out"' "--help"

echo "$pass passed, $fail failed, 0 skipped"
[ $fail -eq 0 ]
