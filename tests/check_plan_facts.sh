#!/usr/bin/env bash
# check_plan_facts.sh - the planner's decision labels are write-only explanation: the library
# and the tool act on the plan's typed facts (ddo_plan_info, struct ddo_plan's route,
# granularity, host_residents and weight_codec), never on a label's words. Reading a label
# back is allowed only where a label is the data: the accessors that hand decisions out
# (src/plan/plan.c, plan_budget.c), reading a saved plan (src/plan/plan_json.c) and the tool's display
# of numbers (tools/ddo/util.c's tool_decision, used by cmd_plan.c and cmd_bench.c: figures,
# not behaviour). The route label
# (ddo_plan_route) is never compared with a word either.
# ctest-labels: unit
set -u
SRC=${DDO_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$SRC" || exit 1
fails=0
lib=$(find src -name '*.c' | sort)
allowed='^(src/plan/plan\.c|src/plan/plan_budget\.c|src/plan/plan_json\.c|tools/ddo/util\.c|tools/ddo/cmd_plan\.c|tools/ddo/cmd_bench\.c):'
hits=$(grep -nE 'ddo__decisions_get|ddo__plan_decision_get|tool_decision\(' -- $lib tools/ddo/*.c |
    grep -vE "$allowed" || true)
if [ -n "$hits" ]; then
    echo "FAIL: a decision label is read back outside the allowed files (use ddo_plan_info):"
    echo "$hits"
    fails=1
fi
# The tool may show decision values, but never compare one with a word.
hits=$(grep -nE '(decision_get|decisions_get|tool_decision)\([^)]*\)[^;]*strcmp|strcmp\([^;]*(decision_get|decisions_get|tool_decision)' \
    -- $lib tools/ddo/*.c | grep -v '^src/plan/plan_json\.c:' || true)
hits2=$(grep -nE 'strcmp\((wc|hr|v), "(ddoc1|registered_in_place|bounce_buffer)"\)' -- $lib \
    tools/ddo/*.c | grep -v '^src/plan/plan_json\.c:' || true)
hits3=$(grep -nE 'strcmp\(ddo_plan_route\(' -- $lib tools/ddo/*.c || true)
if [ -n "$hits$hits2$hits3" ]; then
    echo "FAIL: behaviour decided from a label's words (use ddo_plan_info):"
    printf '%s\n' "$hits" "$hits2" "$hits3" | grep -v '^$'
    fails=1
fi
# The Python binding reads the facts, not the plan JSON's route or decisions, for behaviour.
hits=$(grep -nE 'plan\.get\("(route|unit_granularity)"|plan\["(route|unit_granularity)"\]|\["planner_decisions"\]\[' \
    -- python/ddo/*.py python/ddo/*/*.py || true)
if [ -n "$hits" ]; then
    echo "FAIL: the binding reads the route or a decision from the plan JSON (use ddo_plan_info):"
    echo "$hits"
    fails=1
fi
[ "$fails" = 0 ] && echo "plan facts: labels are write-only"
exit "$fails"
