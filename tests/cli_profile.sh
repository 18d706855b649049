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
"$DDO_BIN" profile frobnicate >/dev/null 2>&1; rc=$?
check '[ $rc -eq 2 ]' "usage error exits 2"
echo "$pass passed, $fail failed, 0 skipped"
[ $fail -eq 0 ]
