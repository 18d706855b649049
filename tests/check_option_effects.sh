#!/usr/bin/env bash
# check_option_effects.sh - the option catalog's effect column (src/config/options.def) is true:
#   LIVE     read by library code other than the configuration's own store, parser, environment,
#            text, documentation and range checks (config.c, config_args.c, config_env.c,
#            config_text.c, config_doc.c, config_validate.c);
#   HOST     read by the tool (tools/ddo) or the Python binding (python/ddo, not the
#            compatibility settings class in settings.py), and by no library code as above;
#   WINDOWS  read by library code as LIVE (it acts on DXGI readings, which only Windows has;
#            test_platform checks that these options change nothing elsewhere), not by the tool;
#   COMPAT   read by neither the library (as above) nor the tool.
# A read is a field access (->key, .key), the option id (DDO_OPT_ID_key) or the key as a whole
# string literal ("key"), on a line that is not a comment.
# ctest-labels: unit
set -u
SRC=${DDO_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$SRC" || exit 1
lib_files=$(find src -name '*.c' | sort | grep -vE '^src/config/config(|_args|_env|_text|_doc|_validate)\.c$')
tool_files=$(ls tools/ddo/*.c)
py_files=$(ls python/ddo/*.py | grep -v '^python/ddo/settings\.py$')
code() { grep -hvE '^\s*(\*|/\*|//|#)' -- "$@"; }
reads() { # key files...: true when some code line of files reads key
    local k=$1
    shift
    code "$@" | grep -qE "(->|\.)$k\b|DDO_OPT_ID_$k\b|\"$k\""
}
rows=$(grep -oE '^DDO_OPT\([a-z0-9_]+, [A-Z]+, [A-Z]+' src/config/options.def | sed -E 's/^DDO_OPT\(//; s/,//g')
[ -n "$rows" ] || { echo "FAIL: no catalog rows found in src/config/options.def"; exit 1; }
fails=0 n=0
while read -r key _type effect; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    case $effect in
    LIVE)
        reads "$key" $lib_files || { echo "FAIL: $key is LIVE but no library code reads it"; fails=1; } ;;
    HOST)
        if ! reads "$key" $tool_files $py_files; then
            echo "FAIL: $key is HOST but neither the tool nor the binding reads it"; fails=1
        fi
        if reads "$key" $lib_files; then
            echo "FAIL: $key is HOST but the library reads it (mark it LIVE)"; fails=1
        fi ;;
    WINDOWS)
        reads "$key" $lib_files || { echo "FAIL: $key is WINDOWS but no library code reads it"; fails=1; }
        if reads "$key" $tool_files; then
            echo "FAIL: $key is WINDOWS but the tool reads it"; fails=1
        fi ;;
    COMPAT)
        if reads "$key" $lib_files $tool_files; then
            echo "FAIL: $key is $effect (no effect) but the library or the tool reads it"; fails=1
        fi ;;
    *)
        echo "FAIL: $key: unknown effect $effect"; fails=1 ;;
    esac
done <<<"$rows"
[ "$fails" = 0 ] && echo "option effects: $n catalog rows agree with their readers"
exit "$fails"
