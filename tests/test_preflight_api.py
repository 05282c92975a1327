"""The seed API (CREDIT's contracts) on CREDIT's config layout and on ours:
estimate_dataloader_memory_gib and check_dataloader_startup."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, Dataset, TensorDataset

from optimus_preflight.compat.credit import (
    check_dataloader_startup,
    dataloader_memory_estimate,
    estimate_dataloader_memory_gib,
)
from optimus_preflight.config.schema import Config
from optimus_preflight.preflight import loader_startup as api
from tests.conftest import tiny_config

GIB = 1024**3


def credit_conf(workers=4, prefetch=4, batch=1, h=721, w=1440, vars_3d=("U", "V", "T"), vars_2d=("SP",), diag_2d=(),
                n_levels=13):
    """A CREDIT training config as CREDIT loads it (yaml.safe_load: plain dicts and lists)."""
    return {
        "trainer": {"thread_workers": workers, "prefetch_factor": prefetch, "train_batch_size": batch},
        "model": {"image_height": h, "image_width": w},
        "data": {"source": {"ERA5": {
            "levels": list(range(n_levels)),
            "variables": {"prognostic": {"vars_3D": list(vars_3d), "vars_2D": list(vars_2d)},
                          "diagnostic": {"vars_2D": list(diag_2d)}},
        }}},
    }


def credit_gib(workers, prefetch, batch, h, w, channels):
    return workers * prefetch * batch * h * w * channels * 4 * 2 / GIB


# ------------------------------------------------------------------ estimate: CREDIT's layout
@pytest.mark.parametrize("wrap", [dict, OmegaConf.create], ids=["dict", "DictConfig"])
def test_estimate_follows_credits_formula_on_credits_layout(wrap):
    conf = wrap(credit_conf())
    # 1-degree ERA5 spot check: 3 x 13 + 1 = 40 channels, input and target float32.
    assert estimate_dataloader_memory_gib(conf) == pytest.approx(credit_gib(4, 4, 1, 721, 1440, 40))
    assert dataloader_memory_estimate(conf)["method"] == "credit"
    more = wrap(credit_conf(workers=2, prefetch=3, batch=5, h=10, w=20, vars_2d=("SP", "T2M"), diag_2d=("TP",)))
    assert estimate_dataloader_memory_gib(more) == pytest.approx(credit_gib(2, 3, 5, 10, 20, 3 * 13 + 3))


def test_estimate_uses_credits_defaults_for_absent_trainer_and_image_keys():
    conf = credit_conf()
    del conf["trainer"], conf["model"]
    # CREDIT's defaults: 4 workers, prefetch 4, batch 1, 721 x 1440.
    assert estimate_dataloader_memory_gib(conf) == pytest.approx(credit_gib(4, 4, 1, 721, 1440, 40))


@pytest.mark.parametrize("conf", [
    {},
    None,
    [],
    "data.batch_size=4",
    {"data": 5},
    {"data": {"source": {}}},
    {"data": {"source": {"ERA5": None}}},
    credit_conf(vars_3d=(), vars_2d=(), diag_2d=()),  # zero channels: 0.0, as CREDIT
    {**credit_conf(), "data": {"source": {"ERA5": {"levels": None, "variables": {"prognostic": {"vars_3D": ["T"]}}}}}},
    {**credit_conf(), "data": {"source": {"ERA5": {"levels": [1], "variables": {"prognostic": {"vars_3D": 7}}}}}},
    {**credit_conf(), "trainer": {"thread_workers": "many"}},
    {**credit_conf(), "model": {"image_height": [721], "image_width": 1440}},
    {"data": {"batch_size": "lots", "train": {"block_size": 32}}},
    {"data": {"batch_size": 4, "train": {"block_size": "${nowhere.block}"}}},
    OmegaConf.create({"data": {"batch_size": 4, "train": {"block_size": "${nowhere.block}"}}}),
    OmegaConf.structured(Config),  # our schema, before composition: model and optimizer are MISSING
], ids=lambda c: type(c).__name__ if not isinstance(c, dict) or len(str(c)) > 60 else str(c))
def test_estimate_is_best_effort_zero_and_never_raises(conf, caplog):
    with caplog.at_level(logging.DEBUG, logger="optimus_preflight"):
        assert estimate_dataloader_memory_gib(conf) == 0.0
    assert "dataloader estimate: 0.0" in caplog.text  # why, for whoever wonders


def test_estimate_coerces_numbers_of_the_wrong_type():
    conf = credit_conf(workers="2", prefetch=2.0, batch="3", h="10", w=20.0)
    assert estimate_dataloader_memory_gib(conf) == pytest.approx(credit_gib(2, 2, 3, 10, 20, 40))
    ours = {"data": {"batch_size": "8", "num_workers": 2.0, "train": {"block_size": "16"}}}
    assert estimate_dataloader_memory_gib(ours) == pytest.approx(2 * 2 * 8 * 2 * 16 * 8 / GIB)


# ------------------------------------------------------------------ estimate: our layout
def test_estimate_reads_our_composed_config_without_instantiating_the_dataset(tiny_cfg, monkeypatch):
    def no_io(*args, **kwargs):
        raise AssertionError("the default estimate must not instantiate data.train")

    monkeypatch.setattr("optimus_preflight.config.instantiate.instantiate_node", no_io)
    estimate = dataloader_memory_estimate(tiny_cfg)
    assert estimate["method"] == "shapes"
    assert estimate["batch_bytes"] == 16 * 2 * 32 * 8  # batch 16, (input, target) of 32 int64 tokens
    cfg = tiny_config("data.num_workers=4", "data.prefetch_factor=3")
    assert estimate_dataloader_memory_gib(cfg) == pytest.approx(4 * 3 * 16 * 2 * 32 * 8 / GIB)


def test_estimate_reads_our_layout_from_a_plain_dict():
    conf = {"data": {"batch_size": 8, "num_workers": 2, "prefetch_factor": None, "train": {"block_size": 64}}}
    assert estimate_dataloader_memory_gib(conf) == pytest.approx(2 * 2 * 8 * 2 * 64 * 8 / GIB)  # torch's prefetch 2
    # The model's context stands in for a dataset node without block_size.
    conf = {"data": {"batch_size": 8}, "model": {"block_size": 64}}
    assert estimate_dataloader_memory_gib(conf) == pytest.approx(8 * 2 * 64 * 8 / GIB)  # no workers: 1 in flight


def test_estimate_reads_a_sample_from_the_configured_dataset_on_request(tiny_cfg):
    estimate = dataloader_memory_estimate(tiny_cfg, read_sample=True)
    assert estimate["method"] == "sample"
    assert estimate["batch_bytes"] == 16 * 2 * 32 * 8


def test_estimate_falls_back_to_config_shapes_when_the_sample_cannot_be_read(tiny_cfg):
    tiny_cfg.data.train._target_ = "no.such.module.dataset"
    estimate = dataloader_memory_estimate(tiny_cfg, read_sample=True)
    assert estimate["method"] == "shapes" and estimate["batch_bytes"] == 16 * 2 * 32 * 8


def test_estimate_uses_the_measured_batch_when_given(tiny_cfg):
    batch = (torch.zeros(16, 32, dtype=torch.long), torch.zeros(16, 32, dtype=torch.long))
    cfg = tiny_config("data.num_workers=4", "data.prefetch_factor=3")
    assert estimate_dataloader_memory_gib(cfg, batch) == pytest.approx(4 * 3 * 2 * 16 * 32 * 8 / GIB)
    assert estimate_dataloader_memory_gib(tiny_cfg, batch=batch) == pytest.approx(2 * 16 * 32 * 8 / GIB)  # 1 in flight
    assert dataloader_memory_estimate(tiny_cfg, batch)["method"] == "measured"
    # CREDIT's settings multiply a measured batch too; an empty config holds one batch.
    assert estimate_dataloader_memory_gib(credit_conf(workers=2, prefetch=3), batch) == pytest.approx(
        2 * 3 * 2 * 16 * 32 * 8 / GIB)
    assert estimate_dataloader_memory_gib({}, batch) == pytest.approx(2 * 16 * 32 * 8 / GIB)


def test_the_loaders_own_settings_win_over_the_config():
    loader = DataLoader(TensorDataset(torch.zeros(8, 3)), batch_size=4, num_workers=2, prefetch_factor=3)
    batch = torch.zeros(4, 1024)
    assert estimate_dataloader_memory_gib({}, batch, loader=loader) == pytest.approx(2 * 3 * 4 * 1024 * 4 / GIB)
    conf = {"data": {"batch_size": 4, "num_workers": 8, "prefetch_factor": 8}}
    assert estimate_dataloader_memory_gib(conf, batch, loader=loader) == pytest.approx(2 * 3 * 4 * 1024 * 4 / GIB)


# ------------------------------------------------------------------ check_dataloader_startup
class Untouchable:
    """A loader that fails the test on any use at all, attribute reads included."""

    def __getattribute__(self, name):
        raise AssertionError(f"the loader was touched ({name})")

    def __iter__(self):
        raise AssertionError("the loader was iterated")


class Hangs(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        time.sleep(3600)


class Explodes(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        raise ValueError(f"dataset exploded at sample {index}")


class ExplodingIter:
    """Not a DataLoader: any iterable whose __iter__ raises (CREDIT's own test loader)."""

    def __iter__(self):
        raise ValueError("dataset exploded")


class SleepsInIter:
    def __iter__(self):
        while True:
            time.sleep(9999)


@pytest.mark.parametrize("conf", [{}, credit_conf(), None], ids=["empty", "credit", "none"])
def test_startup_check_on_other_ranks_returns_at_once_without_touching_the_loader(conf, tiny_cfg):
    check_dataloader_startup(conf, Untouchable(), rank=1, timeout_s=0.001)
    check_dataloader_startup(tiny_cfg, Untouchable(), 3, 300.0)


def test_startup_check_runs_on_every_rank_when_asked(tiny_cfg):
    with pytest.raises(RuntimeError, match="rank 2: the first batch did not arrive within 1 s"):
        check_dataloader_startup(tiny_cfg, DataLoader(Hangs(), batch_size=4), rank=2, timeout_s=1.0, all_ranks=True)


def test_startup_check_raises_an_actionable_error_on_a_hang(tiny_cfg):
    loader = DataLoader(Hangs(), batch_size=4, num_workers=1)
    with pytest.raises(RuntimeError) as caught:
        check_dataloader_startup(tiny_cfg, loader, rank=0, timeout_s=1.0)
    text = str(caught.value)
    assert "did not arrive within 1 s" in text and "__getitem__" in text and "num_workers=0" in text


def test_a_hang_on_credits_layout_names_credits_keys():
    with pytest.raises(RuntimeError) as caught:
        check_dataloader_startup(credit_conf(h=10, w=20), SleepsInIter(), rank=0, timeout_s=0.5)
    text = str(caught.value)
    assert "iter(loader) did not return within 0.5 s" in text and "time.sleep(9999)" in text
    assert "trainer.thread_workers=4" in text and "trainer.prefetch_factor=4" in text
    assert "Estimated DataLoader RAM from the config" in text


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_exception_propagates_as_itself(workers, tiny_cfg, caplog):
    loader = DataLoader(Explodes(), batch_size=4, num_workers=workers)
    with caplog.at_level(logging.ERROR, logger="optimus_preflight"), pytest.raises(ValueError) as caught:
        check_dataloader_startup(tiny_cfg, loader, rank=0, timeout_s=30.0)
    assert "dataset exploded at sample 0" in str(caught.value)  # from a worker, DataLoader adds where it came from
    assert "Fix:" in caplog.text
    with pytest.raises(ValueError, match="^dataset exploded$"):
        check_dataloader_startup({}, ExplodingIter(), rank=0, timeout_s=10.0)


def test_startup_check_passes_a_healthy_loader_and_raises_on_an_empty_one(tiny_cfg, caplog):
    with caplog.at_level(logging.INFO, logger="optimus_preflight"):
        check_dataloader_startup(tiny_cfg, DataLoader(TensorDataset(torch.zeros(8, 3)), batch_size=4), timeout_s=5)
    assert "first batch in" in caplog.text
    with pytest.raises(RuntimeError, match="yields no batches"):
        check_dataloader_startup(tiny_cfg, DataLoader(TensorDataset(torch.zeros(0, 3)), batch_size=4), timeout_s=5)


@pytest.mark.parametrize("conf", [{}, None, credit_conf(), OmegaConf.create({"data": {}})], ids=["empty", "none",
                                                                                                  "credit", "odd"])
def test_startup_check_needs_no_config(conf):
    check_dataloader_startup(conf, DataLoader(TensorDataset(torch.zeros(8, 3)), batch_size=4), timeout_s=5)


def _available(monkeypatch, nbytes):
    monkeypatch.setattr(api.psutil, "virtual_memory", lambda: SimpleNamespace(available=nbytes))


def test_dangerous_memory_warns_then_raises_from_the_measured_batch_and_the_loaders_settings(monkeypatch, caplog):
    loader = DataLoader(TensorDataset(torch.zeros(8, 256)), batch_size=4, num_workers=2, prefetch_factor=2)
    held = 2 * 2 * 4 * 256 * 4  # 4 batches in flight of (4, 256) float32; the empty config knows nothing
    _available(monkeypatch, int(held / 0.6))
    with caplog.at_level(logging.WARNING, logger="optimus_preflight"):
        check_dataloader_startup({}, loader, rank=0, timeout_s=30)
    assert "60% of the available host RAM" in caplog.text and "num_workers=2" in caplog.text
    _available(monkeypatch, int(held / 0.9))
    with pytest.raises(RuntimeError, match="90% of the .* GiB of available host RAM") as caught:
        check_dataloader_startup({}, loader, rank=0, timeout_s=30)
    assert "Fix: lower the DataLoader's num_workers" in str(caught.value)
    with pytest.raises(RuntimeError, match="Fix: lower trainer.thread_workers, trainer.prefetch_factor"):
        check_dataloader_startup(credit_conf(h=1, w=1), loader, rank=0, timeout_s=30)
