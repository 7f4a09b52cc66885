"""The suite keeps to its temporary folders: the embedding cache a test gets by default is its own, "~" is the
session's home, and the session-end check (conftest.no_writes_to_the_user_cache) sees a write to ~/.cache/biencoder."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import conftest
from conftest import compose_cfg, user_cache_writes


@pytest.mark.slow
def test_the_default_embedding_cache_is_the_tests_own(tmp_embedding_cache):
    assert not any(tmp_embedding_cache.iterdir())
    assert Path(compose_cfg([]).trainer.cache_dir) == tmp_embedding_cache  # trainer.cache_dir's default
    # a command line the test starts gets the same folder, and the session's home for "~"
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; from biencoder.engine.config.schema import default_cache_dir; "
            "print(default_cache_dir()); print(os.path.expanduser('~'))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ,
    ).stdout.split()
    assert shown == [str(tmp_embedding_cache), str(conftest.SESSION_HOME)]


def test_home_is_the_sessions_own():
    assert conftest.SESSION_HOME.is_dir() and Path.home() == conftest.SESSION_HOME
    assert Path("~/.cache/biencoder").expanduser().is_relative_to(conftest.SESSION_HOME)


def test_the_session_check_sees_a_write_to_the_default_cache(tmp_path):
    assert user_cache_writes(tmp_path) == []
    shard = tmp_path / ".cache" / "biencoder" / "0123-mean-L64-fp32" / "a.npz"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(b"")
    folder = ".cache/biencoder/0123-mean-L64-fp32"
    assert user_cache_writes(tmp_path) == [folder, f"{folder}/a.npz"]
