#!/usr/bin/env bash
# Runs the whole suite in two lanes at once:
# - the Ray lane: everything that starts Ray (the session app, side clusters), in one process, in
#   file order (two Ray clusters on a 2-core machine only slow each other, and the session's app
#   starts once); it prints as it goes;
# - the side lane: the tests of a real engine in the test process without Ray (`-m engine`),
#   then the unit tests (pytest-xdist, two workers); it prints when both are done.
# The Ray lane spends most of its time waiting on replicas, timeouts and engines starting (a
# full run of it alone kept about 0.7 of the two cores busy), so the side lane fills the idle
# core time instead of running before or after it. In-process engines also change their
# process's environment (vLLM's CPU platform preloads libgomp), which Ray clusters started
# later in the same process inherit; apart, the Ray lane never sees it.
# Each phase prints its 20 slowest tests. pytest's exit 5 ("no tests collected") is a failure
# here. Arguments go to every phase's pytest (e.g. -k NAME); OOO_SPEC_TEST_PHASES picks phases
# (any of unit, engine, ray; e.g. =unit runs one).
set -uo pipefail
cd "$(dirname "$0")/.."
phases=${OOO_SPEC_TEST_PHASES:-engine unit ray}
workers=${OOO_SPEC_TEST_WORKERS:-2}
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider --durations=20)

run_phase() {
  case $1 in
    unit) "${pytest[@]}" -n "$workers" tests/unit "${@:2}" ;;
    engine) "${pytest[@]}" -m engine tests/integration "${@:2}" ;;
    ray) "${pytest[@]}" -m "not engine" tests/integration tests/e2e "${@:2}" ;;
    *) echo "test: unknown phase $1 (unit, engine, ray)" >&2; return 2 ;;
  esac
  local rc=$?
  if [ $rc -eq 5 ]; then
    echo "test: pytest collected no $1 tests; that is a failure" >&2
    rc=1
  fi
  return $rc
}

# The side lane: the engine and unit phases asked for, one after the other.
side_lane() {
  local status=0 rc
  for phase in "$@"; do
    echo "=== $phase phase ==="
    run_phase "$phase" "${args[@]}"
    rc=$?
    echo "=== $phase phase (exit $rc) ==="
    [ $rc -ne 0 ] && status=$rc
  done
  return $status
}

args=("$@")
side=()
ray=""
for phase in $phases; do
  case $phase in
    ray) ray=1 ;;
    *) side+=("$phase") ;;
  esac
done

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
status=0
side_pid=""
if [ ${#side[@]} -gt 0 ]; then
  if [ -n "$ray" ]; then
    echo "test: the ${side[*]} phases run beside the Ray tests; their output follows"
    side_lane "${side[@]}" >"$logs/side.log" 2>&1 &
    side_pid=$!
  else
    side_lane "${side[@]}"
    status=$?
  fi
fi
if [ -n "$ray" ]; then
  run_phase ray "${args[@]}"
  rc=$?
  [ $rc -ne 0 ] && status=$rc
fi
if [ -n "$side_pid" ]; then
  wait "$side_pid"
  rc=$?
  cat "$logs/side.log"
  [ $rc -ne 0 ] && status=$rc
fi
exit $status
