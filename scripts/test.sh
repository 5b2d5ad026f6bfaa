#!/usr/bin/env bash
# Runs the whole suite in two phases at once: the unit tests (pytest-xdist, two workers) beside
# everything that starts Ray or an engine, in one process, in file order (two engines or two Ray
# clusters on a 2-core machine only slow each other, and the session's app starts once). The Ray
# phase spends most of its time waiting on replicas, timeouts and engines starting, so the unit
# tests fill the idle core time instead of running before it. The Ray phase prints as it goes,
# the unit phase when it ends; each prints its 20 slowest tests. pytest's exit 5 ("no tests
# collected") is a failure here. Arguments go to both phases' pytest (e.g. -k NAME);
# OOO_SPEC_TEST_PHASES=unit or =ray runs one.
set -uo pipefail
cd "$(dirname "$0")/.."
phases=${OOO_SPEC_TEST_PHASES:-unit ray}
workers=${OOO_SPEC_TEST_WORKERS:-2}

run_phase() {
  case $1 in
    unit) .venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" --durations=20 tests/unit "${@:2}" ;;
    ray) .venv/bin/python -m pytest -q -p no:cacheprovider --durations=20 tests/integration tests/e2e "${@:2}" ;;
    *) echo "test: unknown phase $1 (unit, ray)" >&2; return 2 ;;
  esac
  local rc=$?
  if [ $rc -eq 5 ]; then
    echo "test: pytest collected no $1 tests; that is a failure" >&2
    rc=1
  fi
  return $rc
}

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
status=0
unit_pid=""
for phase in $phases; do
  if [ "$phase" = unit ] && [ "$phases" != unit ]; then
    echo "test: the unit phase runs beside the others; its output follows theirs"
    run_phase unit "$@" >"$logs/unit.log" 2>&1 &
    unit_pid=$!
  else
    run_phase "$phase" "$@"
    rc=$?
    [ $rc -ne 0 ] && status=$rc
  fi
done
if [ -n "$unit_pid" ]; then
  wait "$unit_pid"
  rc=$?
  echo "=== unit phase (exit $rc) ==="
  cat "$logs/unit.log"
  [ $rc -ne 0 ] && status=$rc
fi
exit $status
