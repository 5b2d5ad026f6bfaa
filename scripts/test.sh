#!/usr/bin/env bash
# Runs the whole suite. pytest's exit 5 ("no tests collected") is a failure here, not a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "test: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit $rc
