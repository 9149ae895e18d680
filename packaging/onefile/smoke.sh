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

# On a terminal, `up` shows its TUI in a process of its own: the binary started again
# (ui/frozen.py). tmux is the terminal (Textual draws on standard error: not
# redirected); q quits both.
command -v tmux > /dev/null || fail "tmux is needed for the TUI's check (apt-get install tmux)"
TMUX_SOCKET="agentworker-smoke-$$"
screen() { tmux -L "$TMUX_SOCKET" capture-pane -p -t main 2>/dev/null || true; }
tmux -L "$TMUX_SOCKET" -f /dev/null new-session -d -s main -x 120 -y 40 \
  "AGENTWORKER_HOME='$AGENTWORKER_HOME' AGENTWORKER_LISTEN='$AGENTWORKER_LISTEN' '$BIN' up; echo \"exit=\$?\" > '$WORK/tui.exit'; sleep 60"
for _ in $(seq 1 600); do
  if screen | grep -q "● ready"; then break; fi
  sleep 0.1
done
screen | grep -q "● ready" || { screen >&2; tmux -L "$TMUX_SOCKET" kill-server; fail "the TUI did not show a ready worker within 60 s"; }
tmux -L "$TMUX_SOCKET" send-keys -t main q
for _ in $(seq 1 300); do
  if [ -f "$WORK/tui.exit" ]; then break; fi
  sleep 0.1
done
tmux -L "$TMUX_SOCKET" kill-server
[ "$(cat "$WORK/tui.exit" 2>/dev/null)" = "exit=0" ] || fail "up with its TUI did not stop on q ($(cat "$WORK/tui.exit" 2>/dev/null || echo 'still running'))"
echo "smoke: the TUI showed a ready worker, and q stopped both"
echo "smoke: ok"
