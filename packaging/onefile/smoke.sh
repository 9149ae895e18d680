#!/usr/bin/env bash
# Smoke-test a one-file agentworker: --version, doctor --json, and a headless call
# through a hub it runs itself (`up`), in a throwaway home. Usage: smoke.sh BINARY
set -euo pipefail
BIN="$(realpath "$1")"
WORK="$(mktemp -d)"
export AGENTWORKER_HOME="$WORK/home"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
export AGENTWORKER_LISTEN="127.0.0.1:$PORT"
UP_PID=""
cleanup() {
  if [ -n "$UP_PID" ] && kill -0 "$UP_PID" 2>/dev/null; then kill -TERM "$UP_PID"; wait "$UP_PID" || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "smoke: $*" >&2; [ -f "$WORK/up.log" ] && sed 's/^/  up: /' "$WORK/up.log" >&2; exit 1; }

version="$("$BIN" --version)"
echo "smoke: $version"
[[ "$version" == agentworker\ * ]] || fail "--version printed '$version'"

# doctor exits 1 only on a blocker; a fresh home has none.
"$BIN" doctor --json --offline > "$WORK/doctor.json" || fail "doctor found a blocker: $(cat "$WORK/doctor.json")"
python3 - "$WORK/doctor.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
checks = {f["check"] for f in report["findings"]}
missing = {"python", "libraries", "config", "bubblewrap", "landlock", "seccomp", "display"} - checks
assert not missing, f"doctor --json lacks {missing}"
libs = next(f for f in report["findings"] if f["check"] == "libraries")
assert libs["status"] == "ok", libs
print(f"smoke: doctor --json: {len(report['findings'])} findings, ok={report['ok']}")
PY

# The service it would install runs this very binary.
"$BIN" service install --print --kind systemd | grep -qx "ExecStart=$BIN --home $AGENTWORKER_HOME up" \
  || fail "service install --print does not run $BIN"

"$BIN" up > "$WORK/up.log" 2>&1 &
UP_PID=$!
for _ in $(seq 1 600); do  # up to 60 s for the hub and worker to come up
  if "$BIN" status > /dev/null 2>&1; then break; fi
  kill -0 "$UP_PID" 2>/dev/null || fail "up exited early"
  sleep 0.1
done
"$BIN" status || fail "no connected worker within 60 s"
"$BIN" grant 'workerHost.fs_*' --agent smoke --for 10m > /dev/null
printf 'one-file\n' > "$WORK/in.txt"
"$BIN" call fs_write '{"path": "smoke.txt", "mode": "create"}' --agent smoke --blob-in "$WORK/in.txt" > "$WORK/write.json" \
  || fail "fs_write: $(cat "$WORK/write.json")"
"$BIN" call fs_read '{"path": "smoke.txt"}' --agent smoke --blob-out "$WORK/out.txt" > "$WORK/read.json" \
  || fail "fs_read: $(cat "$WORK/read.json")"
cmp -s "$WORK/in.txt" "$WORK/out.txt" || fail "fs_read returned other bytes than fs_write wrote"
echo "smoke: a call through the hub wrote and read back a file"
kill -TERM "$UP_PID"
wait "$UP_PID" || fail "up did not stop cleanly on SIGTERM"
UP_PID=""
echo "smoke: ok"
