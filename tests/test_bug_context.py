"""A bug in the user's code keeps its traceback (exit 1), and the last line says where:
which sample (read in the main process or in a DataLoader worker) or which recipe
method."""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.training.error_context import bug_location
from tests.conftest import REPO, run_cli

RUN = ("recipe=char_lm_tiny", "preflight.enabled=false", "logging.progress=none", "trainer.max_steps=6",
       "recipe._target_=tests.data_fault_recipes.FaultyDataRecipe")


def _last_line(result) -> str:
    return [line for line in result.stderr.splitlines() if line.strip()][-1]


def _corrupt_index(result) -> int:
    return int(re.search(r"ValueError: sample (\d+) is corrupt", result.stderr).group(1))


@pytest.mark.slow
def test_a_sample_that_raises_in_the_main_process_is_named_after_the_traceback(tmp_path):
    result = run_cli(tmp_path / "run", *RUN, cwd=REPO, env={"RAISE_AT_READ": "40"})
    assert result.returncode == 1, result.output
    assert "Traceback" in result.stderr
    index = _corrupt_index(result)
    assert _last_line(result) == (f"optimus-train: error in the training data: dataset[{index}] "
                                  f"(FaultyWindows.__getitem__) raised ValueError: sample {index} is corrupt")


@pytest.mark.slow
def test_a_sample_that_raises_in_a_worker_is_named_with_the_worker(tmp_path):
    result = run_cli(tmp_path / "run", *RUN, "data.num_workers=2", cwd=REPO, env={"RAISE_AT_READ": "40"})
    assert result.returncode == 1, result.output
    assert "Caught ValueError in DataLoader worker process" in result.stderr
    index = _corrupt_index(result)
    last = _last_line(result)
    assert re.fullmatch(rf"optimus-train: error in the training data: dataset\[{index}\] \(FaultyWindows.__getitem__\), "
                        rf"in DataLoader worker [01], raised ValueError: sample {index} is corrupt", last), last


@pytest.mark.slow
@pytest.mark.parametrize("builder", ["build_model", "build_optimizer", "build_dataloaders"])
def test_a_builder_that_raises_is_named_after_the_traceback(tmp_path, builder):
    result = run_cli(tmp_path / "run", *RUN, cwd=REPO, env={"RAISE_IN_BUILDER": builder})
    assert result.returncode == 1, result.output
    assert "Traceback" in result.stderr
    assert _last_line(result) == f"optimus-train: error in FaultyDataRecipe.{builder}: RuntimeError: {builder} failed on purpose"


class _Squares(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        if index == 5:
            raise KeyError("no such row")
        return torch.tensor(index * index)


def _broken_collate(batch):
    raise TypeError("cannot stack these")


def _error_of(loader) -> BaseException:
    with pytest.raises(Exception) as caught:
        list(loader)
    return caught.value


def test_the_index_is_named_for_a_map_dataset_and_the_function_for_a_collate_fn():
    error = _error_of(DataLoader(_Squares(), batch_size=3))
    assert bug_location(error) == "error in the data: dataset[5] (_Squares.__getitem__) raised KeyError: 'no such row'"
    error = _error_of(DataLoader(_Squares(), batch_size=None))  # no batching: the dataset gets the index itself
    assert "dataset[5] (_Squares.__getitem__)" in bug_location(error)
    error = _error_of(DataLoader(_Squares(), batch_size=2, collate_fn=_broken_collate))
    assert bug_location(error) == ("error in the data: _broken_collate (reading a batch of _Squares) "
                                   "raised TypeError: cannot stack these")


def test_an_error_outside_user_code_gets_no_line():
    try:
        raise RuntimeError("internal")
    except RuntimeError as error:
        assert bug_location(error) is None
