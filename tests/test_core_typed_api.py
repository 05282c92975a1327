"""The core's typed checks, called without any config: what ``optimus_preflight.compat``
builds on (the seed-shaped calls are tested in test_preflight_api, test_memory_gpu_step,
test_memory_params and test_memory_oom)."""

from __future__ import annotations

import logging
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from optimus_preflight.memory import OOMRecorder, bytes_per_weight, check_gpu_step, meta_param_count
from optimus_preflight.preflight.loader_startup import LoaderSettings, check_first_batch, with_loader_settings
from tests.test_memory_oom import SUFFIXES, synthetic_snapshot


class Hangs(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        time.sleep(3600)


def test_the_first_batch_check_takes_a_loader_and_its_settings(caplog):
    loader = DataLoader(TensorDataset(torch.zeros(8, 3)), batch_size=4)
    with caplog.at_level(logging.INFO, logger="optimus_preflight"):
        check_first_batch(loader, with_loader_settings(None, loader), timeout_s=30)
    assert "first batch in" in caplog.text and "the DataLoader's num_workers=0" in caplog.text


def test_a_hang_names_the_keys_the_caller_gave():
    settings = LoaderSettings(4, 0, None, False, "loader.workers", "loader.prefetch", "loader.batch")
    with pytest.raises(RuntimeError) as caught:
        check_first_batch(DataLoader(Hangs(), batch_size=4), settings, timeout_s=0.5, config_estimate_bytes=1 << 30)
    text = str(caught.value)
    assert "did not arrive within 0.5 s" in text and "loader.workers=0" in text and "loader.batch=4" in text
    assert "Estimated DataLoader RAM from the config: 1.0 GiB" in text


def test_the_gpu_step_check_takes_a_batch_and_logs_under_its_name(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    batch = (torch.randn(2, 8), torch.randint(0, 4, (2,)))
    with caplog.at_level(logging.INFO, logger="optimus_preflight"):
        report = check_gpu_step(model, optimizer, batch, precision="auto", name="my check")
    assert report is not None and report.predicted.peak_bytes > 0 and report.measured_peak_bytes is None
    assert "my check: no CUDA device: predicted CPU-side peak" in caplog.text and not optimizer.state


def test_the_oom_recorder_writes_folder_and_prefix(tmp_path):
    recorder = OOMRecorder(tmp_path / "oom", "step7", hint_kwargs={"precision": "fp32"})
    assert recorder.write(synthetic_snapshot()) is not None
    assert sorted(p.name for p in recorder.written) == sorted(f"step7{suffix}" for suffix in SUFFIXES)
    with pytest.raises(ValueError, match="prefix"):
        OOMRecorder(tmp_path, "")


def test_counts_and_bytes_per_weight_need_no_seed_config():
    assert meta_param_count(lambda: nn.Linear(3, 2)) == 8
    assert bytes_per_weight("lora") == 2.0 and bytes_per_weight("full") == 16.0
    assert bytes_per_weight({"load_in_4bit": True}) == pytest.approx(0.6)
