#!/usr/bin/env bash
# Runs the whole suite: unit tests on both cores, everything that starts Ray or an engine on one
# worker (tests/conftest.py groups it); the 20 slowest tests are printed at the end. pytest's exit
# 5 ("no tests collected") is a failure here, not a pass. Arguments go to pytest (a file, -k ...).
set -uo pipefail
cd "$(dirname "$0")/.."
workers=${OOO_SPEC_TEST_WORKERS:-2}
.venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" --dist loadgroup --durations=20 "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "test: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit $rc
