#!/usr/bin/env bash
# `make loadtest`: the Locust load test, headless and bounded, against the local deployment.
# Uses the server already answering on LOADTEST_PORT; if none does, starts `ooo-spec serve`
# (LOADTEST_CONFIG, default configs/local.yaml) on that port and stops it afterwards.
# Settings: LOADTEST_USERS (16), LOADTEST_SPAWN_RATE (4/s), LOADTEST_TIME (2m),
# LOADTEST_PORT (8000), plus the OOO_SPEC_LOAD_* variables of load_tests/locustfile.py.
set -euo pipefail
cd "$(dirname "$0")/.."
USERS=${LOADTEST_USERS:-16}
SPAWN_RATE=${LOADTEST_SPAWN_RATE:-4}
RUN_TIME=${LOADTEST_TIME:-2m}
PORT=${LOADTEST_PORT:-8000}
CONFIG=${LOADTEST_CONFIG:-configs/local.yaml}
HOST="http://127.0.0.1:${PORT}"
OUT=bench_out
mkdir -p "$OUT"

healthy() {
  .venv/bin/python -c "import httpx, sys; sys.exit(httpx.get('$HOST/healthz', timeout=5).status_code != 200)" 2>/dev/null
}

server_pid=""
stop_server() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    echo "loadtest: stopping the server we started (pid $server_pid)" >&2
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
}
trap stop_server EXIT

if healthy; then
  echo "loadtest: using the server at $HOST" >&2
else
  echo "loadtest: no server at $HOST; starting $CONFIG (log: $OUT/loadtest-server.log)" >&2
  .venv/bin/ooo-spec serve --config "$CONFIG" --port "$PORT" >"$OUT/loadtest-server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 600); do
    healthy && break
    kill -0 "$server_pid" 2>/dev/null || { echo "loadtest: the server exited; see $OUT/loadtest-server.log" >&2; exit 1; }
    sleep 1
  done
  healthy || { echo "loadtest: the server was not ready after 600 s" >&2; exit 1; }
fi

# --stop-timeout: requests in flight when the time is up finish and count, instead of being
# cut off (a cut request is neither a success nor an error). Locust imports the locustfile by
# path; PYTHONPATH (the repository root) makes `load_tests` importable from it.
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" .venv/bin/locust -f load_tests/locustfile.py --headless --only-summary \
  --users "$USERS" --spawn-rate "$SPAWN_RATE" --run-time "$RUN_TIME" --stop-timeout 300 \
  --host "$HOST" --csv "$OUT/loadtest" --loglevel WARNING
