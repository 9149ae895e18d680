"""The token off the command line: `--token-file FILE` (or AGENTWORKER_TOKEN) for every
verb that takes `--token`, which every local user can read in /proc/PID/cmdline."""

from __future__ import annotations

from pathlib import Path

from tests.support.cluster import cluster
from worker.cli._common import VISIBLE_FLAG_WARNING


def test_a_token_file_keeps_the_token_off_the_command_line_and_token_warns(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path / "home", worker=False) as live:
        right, wrong = tmp_path / "right.token", tmp_path / "wrong.token"
        right.write_text(live.token + "\n")
        wrong.write_text("not-the-token\n")
        for path in (right, wrong):
            path.chmod(0o600)
        worker = live.start_worker("--token-file", str(right))
        assert live.token.encode() not in Path(f"/proc/{worker.pid}/cmdline").read_bytes()
        assert live.call("workerDiag.probe")["status"] == "ok"
        quiet = live.cli("status", "--token-file", str(right))
        assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr
        refused = live.cli("workers", "--token-file", str(wrong))  # the file is what is used
        assert refused.returncode == 5 and "refused the token" in refused.stderr, refused.stderr
        # A hub that answers and refuses is not "no hub": status says which it is.
        told = live.cli("status", "--token-file", str(wrong))
        assert told.returncode == 5 and "no hub answered" not in told.stderr, told.stderr
        assert f"the hub at {live.listen} refused the token" in told.stderr, told.stderr
        as_json = live.cli("status", "--json", "--token-file", str(wrong))
        assert as_json.returncode == 5 and '"state": "token_refused"' in as_json.stdout
        missing = live.cli("status", "--token-file", str(tmp_path / "none"))
        assert missing.returncode == 5, missing.stderr
        visible = live.cli("status", "--token", live.token)  # still works, but says why not
        assert visible.returncode == 0 and VISIBLE_FLAG_WARNING in visible.stderr
        both = live.cli("status", "--token", live.token, "--token-file", str(right))
        assert both.returncode == 2 and "not allowed with" in both.stderr
