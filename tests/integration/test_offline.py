"""http_fetch on a machine with no network: a network namespace of its own (made with
`unshare`, loopback only), with a real hub, worker and resolver inside it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs inside the namespace: a cluster on its loopback, two fetches, their answers.
DRIVER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from tests.support.cluster import cluster
    with cluster(Path(sys.argv[1])) as live:
        answers = [
            live.call("workerHost.http_fetch", json.dumps({"url": url}))
            for url in ("https://example.com/", "https://93.184.215.14/")
        ]
    print(json.dumps(answers))
    """
)


@pytest.fixture(scope="module")
def offline_answers(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    home = tmp_path_factory.mktemp("offline") / "home"
    done = subprocess.run(
        [
            "unshare",
            "--map-root-user",
            "--net",
            "sh",
            "-c",
            'ip link set lo up && exec "$0" -c "$1" "$2"',
            sys.executable,
            DRIVER,
            str(home),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    answers: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return answers


def test_offline_lookup_says_dns_did_not_answer_and_may_be_retried(
    offline_answers: list[dict[str, Any]],
) -> None:
    error = offline_answers[0]["error"]
    assert error["code"] == "not_found"
    assert "DNS server did not answer" in error["message"]
    assert "offline" in error["message"]
    assert "spelling" not in error["message"]
    assert error["retryable"] is True
    assert error["details"]["reason"] == "dns_unavailable"


def test_offline_connect_says_the_network_is_unreachable_and_may_be_retried(
    offline_answers: list[dict[str, Any]],
) -> None:
    error = offline_answers[1]["error"]
    assert error["code"] == "not_found"
    assert "network is unreachable" in error["message"]
    assert error["retryable"] is True
    assert error["details"]["reason"] == "network_unreachable"
