from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from worker.config import Paths, first_start, load, roots_of
from worker.errors import ConfigError
from worker.wire.transport import read_or_create_token


@pytest.fixture
def paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    monkeypatch.setenv("AGENTWORKER_HOME", str(tmp_path))
    for var in ("AGENTWORKER_LISTEN", "AGENTWORKER_SERVER", "AGENTWORKER_MAX_CONCURRENCY"):
        monkeypatch.delenv(var, raising=False)
    return Paths.from_env()


def test_agentworker_home_holds_config_and_data(paths: Paths, tmp_path: Path) -> None:
    assert paths.config_dir == paths.data_dir == tmp_path.resolve()


def test_first_start_writes_config_with_workspace_as_only_rw_root(paths: Paths) -> None:
    assert first_start(paths) is True
    config = load(paths)
    assert [(r.path, r.mode) for r in config.root] == [(paths.workspace, "rw")]
    assert paths.workspace.is_dir()
    assert config.grant == [], "nothing is granted until the person grants it"
    assert first_start(paths) is False


def test_precedence_is_file_then_environment_then_flags(
    paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths.ensure()
    paths.config_file.write_text('[worker]\nmax_concurrency = 3\nserver = "127.0.0.1:1"\n')
    assert load(paths).worker.max_concurrency == 3
    monkeypatch.setenv("AGENTWORKER_MAX_CONCURRENCY", "5")
    assert load(paths).worker.max_concurrency == 5
    assert load(paths, {"worker": {"max_concurrency": 7}}).worker.max_concurrency == 7
    assert load(paths, {"worker": {"max_concurrency": None}}).worker.server == "127.0.0.1:1"


def test_unknown_setting_is_an_error_that_names_it(paths: Paths) -> None:
    paths.ensure()
    paths.config_file.write_text("[worker]\nmax_concurency = 3\n")
    with pytest.raises(ConfigError) as err:
        load(paths)
    assert "max_concurency" in err.value.message


def test_broken_toml_says_which_file(paths: Paths) -> None:
    paths.ensure()
    paths.config_file.write_text("[worker\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(paths)


def test_token_is_created_once_with_owner_only_permissions(paths: Paths) -> None:
    paths.ensure()
    token = read_or_create_token(paths.token_file)
    assert len(token) == 64 and int(token, 16) >= 0  # 256 bits in hex: never "-…"
    assert stat.S_IMODE(paths.token_file.stat().st_mode) == 0o600
    assert read_or_create_token(paths.token_file) == token


def test_token_made_by_racing_starts_is_one_whole_token(paths: Paths) -> None:
    """Starts racing to make the token all get the same one, and the file is never
    seen empty: it is written aside and linked into place whole."""
    paths.ensure()
    before = set(paths.token_file.parent.iterdir())
    with ThreadPoolExecutor(8) as pool:
        tokens = set(pool.map(lambda _: read_or_create_token(paths.token_file), range(32)))
    assert len(tokens) == 1 and len(tokens.pop()) == 64
    assert set(paths.token_file.parent.iterdir()) - before == {paths.token_file}


def test_a_shared_home_withholds_every_file_the_worker_trusts(tmp_path: Path) -> None:
    """The CA the worker trusts for its server (as the hub's certificate and key, and
    the exec policy) may lie in a shared folder: replaced there, the agent's CA would
    have the worker hand its token to whoever it trusts."""
    home = tmp_path.resolve()
    own = Paths(config_dir=home / ".config" / "aw", data_dir=home / ".local" / "share" / "aw")
    own.ensure()
    ca, policy = home / "certs" / "ca.pem", home / "certs" / "policy.toml"
    own.config_file.write_text(
        f'[worker]\ntls_ca = "{ca}"\n\n[exec]\npolicy = "{policy}"\n\n'
        f'[[root]]\npath = "{home}"\nmode = "rw"\n'
    )
    (root,) = roots_of(load(own), own)
    assert {ca, policy, own.config_dir, own.data_dir} <= set(root.withheld)
    assert {anchor.path for anchor in root.anchors} == {own.config_dir, own.data_dir}


def test_a_root_that_holds_places_of_the_workers_own_files_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing in such a root could be withheld before it exists (an allowlist.toml
    the agent writes, a ui.sock posing as the person's console); a folder inside them
    that holds none of the worker's files is shared as any other."""
    home = tmp_path.resolve()
    own = Paths(config_dir=home / "config", data_dir=home / "data")
    own.ensure()
    own.workspace.mkdir()
    (own.data_dir / "inner").mkdir()
    roots = "".join(
        f'[[root]]\npath = "{folder}"\nmode = "rw"\n'
        for folder in (own.config_dir, own.data_dir, own.data_dir / "inner", own.workspace)
    )
    own.config_file.write_text(roots)
    shared = [root.path for root in roots_of(load(own), own)]
    assert shared == [own.data_dir / "inner", own.workspace]
    assert caplog.text.count("holds places of the worker's own files") == 2


def test_one_agents_plans_are_half_of_max_plans_unless_set() -> None:
    """Raising max_plans raises what one agent may hold with it."""
    from worker.config import SandboxSection

    assert SandboxSection().plans_per_agent == 32
    assert SandboxSection(max_plans=1000).plans_per_agent == 500
    assert SandboxSection(max_plans=1).plans_per_agent == 1
    assert SandboxSection(max_plans=1000, max_plans_per_agent=7).plans_per_agent == 7
