#!/usr/bin/env bash
# `ddo profile list | show | rm` over DDO_PROFILE_DIR, including a corrupt file that is
# reported and ignored.
# ctest-labels: cli
set -u
pass=0; fail=0
check() { if eval "$1"; then pass=$((pass + 1)); echo "ok: $2"; else fail=$((fail + 1)); echo "FAILED: $2"; fi; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export DDO_PROFILE_DIR="$dir/profiles"

out=$("$DDO_BIN" profile list 2>&1); rc=$?
check '[ $rc -eq 0 ] && grep -q "no profiles in $DDO_PROFILE_DIR" <<<"$out"' "empty list"

# Without DDO_PROFILE_DIR the directory is under HOME, else USERPROFILE (Windows' home). Not
# under Wine, which sets USERPROFILE itself.
if [ -z "${TEST_ON_WINDOWS:-}" ]; then
    out=$(env -u DDO_PROFILE_DIR -u HOME USERPROFILE="$dir/up" "$DDO_BIN" profile list 2>&1); rc=$?
    check '[ $rc -eq 0 ] && grep -q "no profiles in $dir/up/.ddo/profiles" <<<"$out"' "USERPROFILE without HOME"
    out=$(env -u DDO_PROFILE_DIR HOME="$dir/h" USERPROFILE="$dir/up" "$DDO_BIN" profile list 2>&1)
    check 'grep -q "no profiles in $dir/h/.ddo/profiles" <<<"$out"' "HOME before USERPROFILE"
fi

mkdir -p "$DDO_PROFILE_DIR"
cat >"$DDO_PROFILE_DIR/ddo-capacity-v1-000000000000000000000000.json" <<'JSON'
{"schema_version": 1, "profile_key": "ddo-capacity-v1-000000000000000000000000",
 "updated_at": "2026-11-29T10:00:00.000000+00:00",
 "context": {"identity_version": 2, "model_class": "m", "name": "flux-1024"},
 "capacity_limits": {}, "observations": [{"status": "success"}],
 "recommendation": {"profile_resident_module_budget_gb": 1.25}}
JSON
echo '{ broken' >"$DDO_PROFILE_DIR/ddo-capacity-v1-ffffffffffffffffffffffff.json"

out=$("$DDO_BIN" profile list 2>&1); rc=$?
check '[ $rc -eq 0 ] && grep -q "^flux-1024 .* 1.2500$" <<<"$out"' "list shows name and budget"
check 'grep -q "corrupt profile" <<<"$out"' "corrupt file reported"
out=$("$DDO_BIN" profile show flux-1024 2>&1); rc=$?
check '[ $rc -eq 0 ] && grep -q "\"profile_resident_module_budget_gb\": 1.25" <<<"$out"' "show prints the document"
"$DDO_BIN" profile show nothing >/dev/null 2>&1; rc=$?
check '[ $rc -eq 1 ]' "show of an unknown name fails"
out=$("$DDO_BIN" profile rm flux-1024 2>&1); rc=$?
check '[ $rc -eq 0 ] && [ ! -e "$DDO_PROFILE_DIR/ddo-capacity-v1-000000000000000000000000.json" ]' "rm removes it"
# A calibration run saves the next run's budget; the next run with the name applies it.
tiny="$DDO_TEST_DATA/safetensors/tiny_flux"
out=$("$DDO_BIN" profile build tiny "$tiny" --ddo-execution-device cpu --steps 1 --tokens 2 2>&1); rc=$?
check '[ $rc -eq 0 ] && grep -q "^profile .tiny.: calibrating" <<<"$out"' "build calibrates"
check 'grep -q "^profile .tiny.: saved: peak .* next run.s resident budget [0-9.]* GiB" <<<"$out"' "build saves"
out=$("$DDO_BIN" profile list 2>&1)
check 'grep -q "^tiny " <<<"$out"' "list shows the calibrated profile"
out=$("$DDO_BIN" run "$tiny" --ddo-execution-device cpu --ddo-profile-name tiny --steps 1 --tokens 2 2>&1); rc=$?
check '[ $rc -eq 0 ] && grep -q "^profile .tiny.: resident budget [0-9.]* GiB from the last calibration" <<<"$out"' "next run applies it"
out=$("$DDO_BIN" run "$tiny" --ddo-execution-device cpu --ddo-profile-name tiny --ddo-resident-module-budget-gb 2 --steps 1 --tokens 2 2>&1)
check 'grep -q "manual resident_module_budget_gb of 2.0000 GiB wins" <<<"$out"' "a manual budget wins"
out=$("$DDO_BIN" run "$tiny" --ddo-execution-device cpu --ddo-build-profile --steps 1 2>&1); rc=$?
check '[ $rc -ne 0 ] && grep -q "needs profile_name" <<<"$out"' "calibration without a name is refused"

"$DDO_BIN" profile frobnicate >/dev/null 2>&1; rc=$?
check '[ $rc -eq 2 ]' "usage error exits 2"
echo "$pass passed, $fail failed, 0 skipped"
[ $fail -eq 0 ]
