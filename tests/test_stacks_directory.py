"""The temporary directory DataLoader workers dump their stacks into: made only when workers
start, removed at the end, and removed by the next run when a process died holding it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest
import torch
from torch.utils.data import DataLoader

from optimus_preflight.mixins.data_workers import open_watched
from optimus_preflight.preflight.data_access.fetch import GuardedBatches
from optimus_preflight.preflight.data_access.worker_stacks import StacksDirectory, remove_orphaned_stacks

PREFIX = "optimus-test-stacks-"


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _stacks_dirs(root) -> list[str]:
    return [path.name for path in root.iterdir() if "stacks-" in path.name]  # multiprocessing keeps its own


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_nothing_is_made_for_a_loader_without_workers_and_the_workers_directory_is_removed(temp_root):
    stacks = StacksDirectory(PREFIX)
    list(open_watched(DataLoader(list(range(8)), batch_size=4), stacks))
    assert stacks.created is None and not _stacks_dirs(temp_root)

    iterator = open_watched(DataLoader(list(range(8)), batch_size=4, num_workers=1), stacks)
    assert [batch.tolist() for batch in iterator] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    made = stacks.created
    assert made is not None and os.path.basename(made).startswith(f"{PREFIX}{os.getpid()}-")
    assert os.listdir(made) == ["worker-0.txt"]  # the worker registered its stack file there
    stacks.remove()
    assert not _stacks_dirs(temp_root)


def test_the_preflights_guarded_loader_leaves_no_directory(temp_root):
    with GuardedBatches(DataLoader(torch.arange(8), batch_size=4, num_workers=1), timeout_s=60) as batches:
        assert next(batches).tolist() == [0, 1, 2, 3]
        assert len(_stacks_dirs(temp_root)) == 1
    assert not _stacks_dirs(temp_root)


def test_a_dead_processs_directory_is_removed_by_the_next_one_and_nothing_else_is(temp_root):
    dead = temp_root / f"{PREFIX}{_dead_pid()}-abc"
    alive = temp_root / f"{PREFIX}{os.getppid()}-def"  # the test runner's parent: alive
    other = temp_root / f"{PREFIX}notapid"
    unrelated = temp_root / f"another-tool-{_dead_pid()}-x"
    for directory in (dead, alive, other, unrelated):
        directory.mkdir()
        (directory / "worker-0.txt").write_text("stack")

    made = StacksDirectory(PREFIX).path
    assert not dead.exists()
    assert alive.exists() and other.exists() and unrelated.exists() and os.path.isdir(made)


def test_an_unreadable_root_is_left_alone(tmp_path):
    remove_orphaned_stacks(PREFIX, root=str(tmp_path / "missing"))  # no error
