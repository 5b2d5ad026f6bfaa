#!/usr/bin/env bash
# Runs the whole suite in two phases: the unit tests on both cores (pytest-xdist), then
# everything that starts Ray or an engine in one process, in file order (two engines or two Ray
# clusters on a 2-core machine only slow each other, and the session's app starts once). Each
# phase prints its 20 slowest tests. pytest's exit 5 ("no tests collected") is a failure here.
# Arguments go to both phases' pytest (e.g. -k NAME); OOO_SPEC_TEST_PHASES=unit or =ray runs one.
set -uo pipefail
cd "$(dirname "$0")/.."
phases=${OOO_SPEC_TEST_PHASES:-unit ray}
workers=${OOO_SPEC_TEST_WORKERS:-2}
status=0
for phase in $phases; do
  case $phase in
    unit) .venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" --durations=20 tests/unit "$@" ;;
    ray) .venv/bin/python -m pytest -q -p no:cacheprovider --durations=20 tests/integration tests/e2e "$@" ;;
    *) echo "test: unknown phase $phase (unit, ray)" >&2; exit 2 ;;
  esac
  rc=$?
  if [ $rc -eq 5 ]; then
    echo "test: pytest collected no $phase tests; that is a failure" >&2
    rc=1
  fi
  [ $rc -ne 0 ] && status=$rc
done
exit $status
