"""The seed API on our config: estimate_dataloader_memory_gib and check_dataloader_startup."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from optimus_preflight.preflight import check_dataloader_startup, estimate_dataloader_memory_gib
from optimus_preflight.preflight.api import dataloader_memory_estimate
from tests.conftest import tiny_config

GIB = 1024**3


def test_estimate_uses_the_measured_batch_when_given(tiny_cfg):
    batch = (torch.zeros(16, 32, dtype=torch.long), torch.zeros(16, 32, dtype=torch.long))
    cfg = tiny_config("data.num_workers=4", "data.prefetch_factor=3")
    assert estimate_dataloader_memory_gib(cfg, batch) == pytest.approx(4 * 3 * 2 * 16 * 32 * 8 / GIB)
    assert estimate_dataloader_memory_gib(tiny_cfg, batch) == pytest.approx(2 * 16 * 32 * 8 / GIB)  # 1 in flight


def test_estimate_reads_a_sample_from_the_configured_dataset(tiny_cfg):
    estimate = dataloader_memory_estimate(tiny_cfg)
    assert estimate["method"] == "sample"
    assert estimate["batch_bytes"] == 16 * 2 * 32 * 8  # batch 16, (input, target) of 32 int64 tokens


def test_estimate_falls_back_to_config_shapes(tiny_cfg):
    tiny_cfg.data.train._target_ = "no.such.module.dataset"
    estimate = dataloader_memory_estimate(tiny_cfg)
    assert estimate["method"] == "shapes" and estimate["batch_bytes"] == 16 * 2 * 32 * 8


def test_estimate_accepts_a_plain_dict():
    conf = {"data": {"batch_size": 8, "num_workers": 2, "prefetch_factor": None, "pin_memory": False, "train": None}}
    assert estimate_dataloader_memory_gib(conf) == 0.0  # nothing to measure: best effort, like CREDIT's
    assert estimate_dataloader_memory_gib(conf, torch.zeros(8, 1024)) == pytest.approx(2 * 2 * 8 * 1024 * 4 / GIB)


class Hangs(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        time.sleep(3600)


def test_startup_check_raises_an_actionable_error_on_a_hang(tiny_cfg):
    loader = DataLoader(Hangs(), batch_size=4, num_workers=1)
    with pytest.raises(RuntimeError) as caught:
        check_dataloader_startup(tiny_cfg, loader, rank=0, timeout_s=1.0)
    text = str(caught.value)
    assert "did not arrive within 1 s" in text and "__getitem__" in text and "num_workers=0" in text


def test_startup_check_passes_a_healthy_loader_and_raises_on_errors(tiny_cfg):
    check_dataloader_startup(tiny_cfg, DataLoader(TensorDataset(torch.zeros(8, 3)), batch_size=4), timeout_s=5)
    with pytest.raises(RuntimeError, match="yields no batches"):
        check_dataloader_startup(tiny_cfg, DataLoader(TensorDataset(torch.zeros(0, 3)), batch_size=4), timeout_s=5)
