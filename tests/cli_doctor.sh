#!/usr/bin/env bash
# `ddo doctor`: reports the host side without a GPU, measures a checkpoint's read speed,
# says what auto would plan, and gives one recommendation line.
# ctest-labels: cli
set -u
pass=0; fail=0
check() { if eval "$1"; then pass=$((pass + 1)); echo "ok: $2"; else fail=$((fail + 1)); echo "FAILED: $2"; fi; }
out=$(mktemp); err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
fixture="$DDO_TEST_DATA/safetensors/tiny_flux"

"$DDO_BIN" doctor "$fixture" --measure-mb 16 >"$out" 2>"$err"; rc=$?
check '[ $rc -eq 0 ]' "doctor exits 0"
check 'grep -q "^host      RAM" "$out"' "host line"
check 'grep -q "^recommendation: " "$out"' "one recommendation line"
check 'grep -q "^file      .*diffusion_pytorch_model.safetensors: .* page cache .* GB/s" "$out"' "file read speed"
check 'grep -q "^auto      backend linear, preset auto -> route one_shot_fast" "$out"' "auto resolves to one_shot_fast"
if ! grep -q "^gpu 0 " "$out"; then
    check 'grep -q "^driver    no GPU: " "$out"' "no GPU is said plainly"
    check 'grep -q "No GPU answered" "$out"' "recommendation names the cpu device"
fi

"$DDO_BIN" doctor --json --measure-mb 16 >"$out" 2>"$err"; rc=$?
check '[ $rc -eq 0 ]' "doctor --json exits 0"
check 'grep -q "\"ram_available_bytes\": [1-9]" "$out"' "json host RAM"
check 'grep -q "\"recommendation\": \"" "$out"' "json recommendation"
check 'grep -q "\"driver\": {" "$out"' "json driver"

"$DDO_BIN" doctor --bogus >"$out" 2>"$err"; rc=$?
check '[ $rc -eq 2 ]' "usage error exits 2"
"$DDO_BIN" doctor /nonexistent/model.safetensors >"$out" 2>"$err"; rc=$?
check '[ $rc -eq 0 ] && grep -q "^file      .*nonexistent" "$out"' "unreadable path reported, not fatal"

echo "$pass passed, $fail failed, 0 skipped"
[ $fail -eq 0 ]
