"""Data-stage checks: each fires on a deliberately broken loader, with the right code."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import namedtuple

import psutil
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from optimus_preflight.preflight.checks import data_checks
from optimus_preflight.preflight.checks.batch_checks import CollateCheck, FinalBatchCheck, SamplingCheck
from optimus_preflight.preflight.checks.data_checks import DuplicateSamplesCheck, FirstBatchCheck, LoaderMemoryCheck
from optimus_preflight.preflight.framework import CheckStatus
from optimus_preflight.training.distributed import DistEnv
from tests.preflight_support import FEATURES, assert_quiet, classification_data, codes, plain_context, run


class SleepsForever(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        time.sleep(3600)  # the hang preflight must point at
        return torch.zeros(FEATURES), 0


def _children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize("workers", [2, 0])
def test_hung_first_batch_is_caught_with_its_frame_and_nothing_left_running(tmp_path, workers):
    timeout = 2.0
    ctx = plain_context(tmp_path, f"data.num_workers={workers}", f"preflight.first_batch_timeout_s={timeout}",
                         dataset=SleepsForever())
    before = _children()
    result = run(ctx, FirstBatchCheck)["data.first_batch"]  # the dataset sleeps an hour: a report, not a wait
    assert result.status == CheckStatus.ERROR and codes(result) == {"DATA_TIMEOUT"}
    message = result.issues[0].message
    assert "in __getitem__: time.sleep(3600)" in message and "test_preflight_data.py" in message
    # Debugging in one process is the advice only where the loader is not in one already.
    assert ("num_workers=0" in result.issues[0].fix) == (workers > 0)
    assert _children() <= before  # every worker process is gone
    assert not [t for t in threading.enumerate() if t.name == "preflight-fetch"]
    if workers:
        assert any(name.startswith("worker") for name in result.data["stacks"])


class Ragged(Dataset):
    """Windows of 8 values, except the last 16 samples which are shorter."""

    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.ones(8 if index < 48 else 5), torch.tensor(0)


def test_ragged_samples_in_the_first_batch_report_their_shapes(tmp_path):
    ctx = plain_context(tmp_path, "data.batch_size=64", dataset=Ragged())
    result = run(ctx, FirstBatchCheck)["data.first_batch"]
    assert codes(result) == {"DP4"}
    assert "[(8,), ()]" in result.issues[0].message and "[(5,), ()]" in result.issues[0].message


class NormalizeBeforeToTensor(Dataset):
    """Compose([Normalize(...), ToTensor()]) on a PIL-like image: torchvision (not installed
    here) refuses in ``functional.normalize`` with this message."""

    def __len__(self):
        return 64

    def __getitem__(self, index):
        image = object()  # what PIL.Image.open returns, as far as Normalize can tell
        raise TypeError(f"img should be Tensor Image. Got {type(image)}")


@pytest.mark.parametrize("workers", [0, 2])
def test_normalize_before_to_tensor_is_named_with_the_order_fix(tmp_path, workers):
    ctx = plain_context(tmp_path, f"data.num_workers={workers}", dataset=NormalizeBeforeToTensor())
    result = run(ctx, FirstBatchCheck)["data.first_batch"]
    assert result.status == CheckStatus.ERROR and codes(result) == {"DP13"}
    assert "img should be Tensor Image" in result.issues[0].message
    assert "put ToTensor() before Normalize(mean, std)" in result.issues[0].fix


def test_ragged_samples_later_in_the_dataset_are_found_by_the_collate_scan(tmp_path):
    ctx = plain_context(tmp_path, "data.shuffle=false", dataset=Ragged())
    results = run(ctx, FirstBatchCheck, CollateCheck)
    assert_quiet(results["data.first_batch"])  # the first 16 samples happen to agree
    assert codes(results["data.collate"]) == {"DP4"}
    assert "[(8,), ()]" in results["data.collate"].issues[0].message


class Stream(IterableDataset):
    def __init__(self, sharded: bool):
        self.sharded = sharded

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for index in range(200):
            if self.sharded and info is not None and index % info.num_workers != info.id:
                continue
            yield torch.full((FEATURES,), float(index)), index % 4


@pytest.mark.parametrize("sharded", [False, True])
def test_unsharded_iterable_dataset_repeats_samples_across_workers(tmp_path, sharded):
    ctx = plain_context(tmp_path, "data.num_workers=2", dataset=Stream(sharded),
                         loader=lambda data: DataLoader(data, batch_size=8, num_workers=2))
    result = run(ctx, DuplicateSamplesCheck)["data.duplicates"]
    if sharded:
        assert_quiet(result)
    else:
        assert codes(result) == {"DP2"} and result.status == CheckStatus.ERROR


class Windows(Dataset):
    """Sliding windows over a signal; a stride of int(64 * 0.01) == 0 serves window 0 for every index."""

    def __init__(self, stride_fraction: float, toy: bool = False):
        self.signal = torch.randn(4096, generator=torch.Generator().manual_seed(0))
        self.stride = int(FEATURES * stride_fraction)
        self.toy = toy

    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int):
        if self.toy:  # XOR: four distinct rows, repeated on purpose
            bits = torch.tensor([index % 2, (index // 2) % 2], dtype=torch.float32)
            return torch.cat([bits, torch.zeros(FEATURES - 2)]), int(bits[0]) ^ int(bits[1])
        start = index * self.stride
        return self.signal[start : start + FEATURES], 1


class OneImage(Dataset):
    """f"img_{{idx}}.png": the same image for every index, each with its own label."""

    def __init__(self):
        self.image = torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int):
        return self.image.clone(), index % 4


@pytest.mark.parametrize(("dataset", "fires"), [
    (Windows(0.01), True),             # stride 0: one window under 256 indices
    (OneImage(), True),                # one input, differing labels
    (Windows(0.5), False),
    (Windows(0.5, toy=True), False),   # a toy task with few distinct rows is not a bug
])
def test_a_dataset_serving_one_sample_for_every_index(tmp_path, dataset, fires):
    ctx = plain_context(tmp_path, dataset=dataset, loader=lambda data: DataLoader(data, batch_size=32, shuffle=True))
    result = run(ctx, FirstBatchCheck, DuplicateSamplesCheck)["data.duplicates"]
    if fires:
        assert codes(result) == {"DATA_IDENTICAL"} and result.status == CheckStatus.WARNING
        assert "1 distinct" in result.issues[0].message and "32" in result.issues[0].message
    else:
        assert_quiet(result)


class Buckets(Dataset):
    """Rows looked up by a bucket number instead of the index: 1200 indices, 12 distinct rows."""

    def __init__(self, per_row: int = 100, rows: int = 12):
        g = torch.Generator().manual_seed(0)
        self.features, self.labels = torch.randn(rows, FEATURES, generator=g), torch.randint(0, 4, (rows,), generator=g)
        self.per_row = per_row

    def __len__(self) -> int:
        return len(self.features) * self.per_row

    def __getitem__(self, index: int):
        if index >= len(self):
            raise IndexError(index)
        row = index // self.per_row  # the bug: a bucket number used as the row
        return self.features[row], int(self.labels[row])


def _few_distinct(tmp_path, dataset, **loader_kwargs):
    loader_kwargs = loader_kwargs or {"shuffle": True}
    ctx = plain_context(tmp_path, dataset=dataset, loader=lambda data: DataLoader(data, batch_size=32, **loader_kwargs))
    return run(ctx, FirstBatchCheck, DuplicateSamplesCheck)["data.duplicates"]


def test_a_shuffled_dataset_serving_a_dozen_rows_under_many_indices_fires(tmp_path):
    result = _few_distinct(tmp_path, Buckets())
    assert codes(result) == {"DATA_FEW_DISTINCT"} and result.status == CheckStatus.WARNING
    issue = result.issues[0]
    assert "1200 indices" in issue.message and result.data["window_distinct"] <= 16
    assert "idx // k" in issue.fix and "DATA_FEW_DISTINCT" in issue.fix


def test_oversampled_minority_rows_categorical_tables_and_sampling_with_replacement_are_quiet(tmp_path):
    from torch.utils.data import ConcatDataset, TensorDataset, WeightedRandomSampler

    g = torch.Generator().manual_seed(0)
    majority = TensorDataset(torch.randn(1000, FEATURES, generator=g), torch.zeros(1000, dtype=torch.long))
    minority = TensorDataset(torch.randn(100, FEATURES, generator=g), torch.ones(100, dtype=torch.long))
    assert_quiet(_few_distinct(tmp_path, ConcatDataset([majority] + [minority] * 10)))  # minority repeated tenfold
    categorical = torch.randint(0, 2, (1200, 3), generator=g).float()  # eight distinct rows by nature
    assert_quiet(_few_distinct(tmp_path, TensorDataset(categorical, categorical[:, 0].long())))
    small = TensorDataset(torch.randn(40, FEATURES, generator=g), torch.randint(0, 2, (40,), generator=g))
    sampler = WeightedRandomSampler(torch.ones(40), num_samples=1200, replacement=True)
    assert_quiet(_few_distinct(tmp_path, small, sampler=sampler))  # repeats are the sampler's, by design
    states = torch.randn(12, FEATURES, generator=g)  # a small MDP's replay buffer: 12 transitions, stored 100 times
    visits = torch.randint(0, 12, (1200,), generator=g)
    replay = TensorDataset(states[visits], torch.randn(12, generator=g)[visits])
    result = _few_distinct(tmp_path, replay)
    assert_quiet(result)  # the stored tensors repeat: data, not index arithmetic
    assert result.data["stored_distinct"][0] <= 12
    assert_quiet(_few_distinct(tmp_path, Buckets(per_row=1, rows=1200)))


def test_distinct_pool_inverts_the_expected_distinct_count():
    assert data_checks.distinct_pool(11, 32) in range(10, 15)
    assert data_checks.distinct_pool(31, 32) > 200


class WithBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 8), nn.BatchNorm1d(8), nn.Linear(8, 4))

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize(("overrides", "expected"), [
    (("trainer.max_steps=8",), "error"),            # the epoch's size-1 last batch is reached
    (("trainer.max_steps=1",), "info"),             # the run ends before it
    (("trainer.max_steps=8", "data.drop_last=true"), None),
])
def test_final_batch_of_one_under_batchnorm(tmp_path, overrides, expected):
    ctx = plain_context(tmp_path, *overrides, model=WithBatchNorm, dataset=classification_data(33))
    result = run(ctx, FinalBatchCheck)["data.final_batch"]
    if expected is None:
        assert_quiet(result)
    else:
        assert codes(result) == {"DP8"} and result.issues[0].severity.value == expected


def test_final_batch_is_quiet_without_batchnorm(tmp_path):
    assert_quiet(run(plain_context(tmp_path, dataset=classification_data(33)), FinalBatchCheck)["data.final_batch"])


def test_unshuffled_training_loader_warns(tmp_path):
    result = run(plain_context(tmp_path, "data.shuffle=false"), SamplingCheck)["data.sampling"]
    assert codes(result) == {"DP14"} and result.status == CheckStatus.WARNING
    assert result.issues[0].config_key == "data.shuffle"


def test_sampler_not_sharded_across_ranks_fails(tmp_path):
    ctx = plain_context(tmp_path, loader=lambda data: DataLoader(data, batch_size=16, shuffle=True))
    ctx.training = dataclasses.replace(ctx.training, dist=DistEnv(rank=0, world_size=2))
    result = run(ctx, SamplingCheck)["data.sampling"]
    assert codes(result) == {"DP2"} and result.status == CheckStatus.ERROR
    assert_quiet(run(plain_context(tmp_path), SamplingCheck)["data.sampling"])


Memory = namedtuple("Memory", "total available")


@pytest.mark.parametrize(("available", "status"), [(10**12, CheckStatus.PASSED), (8_000, CheckStatus.WARNING),
                                                    (6_000, CheckStatus.ERROR)])
def test_loader_memory_from_the_measured_batch(tmp_path, monkeypatch, available, status):
    # 16 samples x (8 float32 + 1 int64) = 640 bytes; 2 workers x prefetch 4 = 8 batches in flight.
    ctx = plain_context(tmp_path, "data.num_workers=2", "data.prefetch_factor=4")
    monkeypatch.setattr(data_checks.psutil, "virtual_memory", lambda: Memory(2 * available, available))
    result = run(ctx, LoaderMemoryCheck)["data.loader_memory"]
    assert result.data["total_bytes"] == 640 * 8
    assert result.status == status
    if status != CheckStatus.PASSED:
        # The fix names the DataLoader argument (the key where it is read, the argument where not).
        assert codes(result) == {"DATA_RAM"} and "prefetch_factor" in result.issues[0].fix


def test_worker_batches_larger_than_dev_shm_fail(tmp_path, monkeypatch):
    ctx = plain_context(tmp_path, "data.num_workers=2")
    run(ctx, FirstBatchCheck)
    usage = data_checks.shutil.disk_usage
    monkeypatch.setattr(data_checks.shutil, "disk_usage",
                        lambda path: usage(path)._replace(free=1000) if path == "/dev/shm" else usage(path))
    result = run(ctx, LoaderMemoryCheck)["data.loader_memory"]
    assert codes(result) == {"DP15"} and result.status == CheckStatus.ERROR


class Broken(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        raise ValueError(f"cannot read sample {index}")


def test_a_dataset_that_raises_is_reported_not_crashed(tmp_path):
    result = run(plain_context(tmp_path, dataset=Broken()), FirstBatchCheck)["data.first_batch"]
    assert codes(result) == {"DATA_ERROR"} and "cannot read sample" in result.issues[0].message


def test_an_empty_loader_is_reported(tmp_path):
    result = run(plain_context(tmp_path, dataset=classification_data(0)), FirstBatchCheck)["data.first_batch"]
    assert codes(result) == {"DATA_EMPTY"}


def test_healthy_loader_with_workers_is_quiet(tmp_path):
    results = run(plain_context(tmp_path, "data.num_workers=2"), FirstBatchCheck, LoaderMemoryCheck,
                  DuplicateSamplesCheck, CollateCheck, FinalBatchCheck, SamplingCheck)
    for result in results.values():
        assert_quiet(result)
    assert results["data.first_batch"].data["latency_s"] > 0


def test_a_subset_given_a_boolean_mask_serves_two_samples_and_is_named():
    from torch.utils.data import Subset

    from optimus_preflight.preflight import run_preflight

    g = torch.Generator().manual_seed(0)
    table = list(zip(torch.randn(600, FEATURES, generator=g), torch.randint(0, 4, (600,), generator=g)))  # records
    mask = (torch.rand(600, generator=g) < 0.8).tolist()
    model = nn.Linear(FEATURES, 4)
    report = run_preflight(model, torch.optim.SGD(model.parameters(), 0.1),
                           DataLoader(Subset(table, mask), batch_size=32, shuffle=True),  # True/False read as 1/0
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), DuplicateSamplesCheck()])
    issue = next(issue for _, issue in report.issues() if issue.code == "DATA_IDENTICAL")
    assert "2 distinct samples" in issue.message and "boolean mask" in issue.message
    assert "torch.nonzero(mask)" in issue.fix


def test_an_adjacency_filled_with_a_whole_index_tensor_is_a_constant_field():
    from torch.utils.data import TensorDataset

    from optimus_preflight.preflight import run_preflight

    g = torch.Generator().manual_seed(1)
    features, labels = torch.randn(64, 10, 4, generator=g), torch.randint(0, 3, (64, 10), generator=g)
    adjacency = torch.zeros(64, 10, 10)
    for graph in range(64):
        edge_index = torch.stack([torch.arange(10), torch.randint(0, 10, (10,), generator=g)])
        adjacency[graph][edge_index] = 1  # whole rows: every node connected to every other
    model = nn.Linear(4, 3)

    def node_loss(model, batch):
        x, a, y = batch
        return nn.functional.cross_entropy(model(a @ x).reshape(-1, 3), y.reshape(-1))

    report = run_preflight(model, torch.optim.SGD(model.parameters(), 0.1),
                           DataLoader(TensorDataset(features, adjacency, labels), batch_size=32, shuffle=True),
                           loss_fn=node_loss, checks=[FirstBatchCheck(), DuplicateSamplesCheck()])
    issue = next(issue for _, issue in report.issues() if issue.code == "DATA_IDENTICAL")
    assert "holds one value (1)" in issue.message and "A[edge_index[0], edge_index[1]]" in issue.message


def test_an_unshuffled_loader_of_one_batch_per_epoch_is_quiet():
    """A full-batch loader (a whole graph, a tiny table): the order of one batch changes nothing."""
    from torch.utils.data import TensorDataset

    from optimus_preflight.preflight import run_preflight

    model = torch.nn.Linear(4, 2)
    dataset = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    for batch_size, quiet in ((64, True), (16, False)):
        report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(dataset, batch_size=batch_size),
                               loss_fn=torch.nn.CrossEntropyLoss(), checks=[SamplingCheck()])
        assert ("DP14" in {i.code for i in report.check("data.sampling").issues}) != quiet


@pytest.mark.parametrize("per_item", [False, True])
def test_a_generator_seeded_the_same_in_every_getitem_is_named(per_item):
    import random

    import numpy as np

    from optimus_preflight.preflight import run_preflight

    class Procedural(torch.utils.data.Dataset):
        def __len__(self):
            return 512

        def __getitem__(self, idx):
            rng = np.random.default_rng(7 + idx if per_item else 7)
            x = torch.from_numpy(rng.normal(size=FEATURES).astype("float32"))
            return x, int(x[0] > 0)

    np.random.seed(3)
    random.seed(3)
    before = (np.random.random(), random.random())
    np.random.seed(3)
    random.seed(3)
    model = nn.Linear(FEATURES, 2)
    report = run_preflight(model, torch.optim.SGD(model.parameters(), 0.1),
                           DataLoader(Procedural(), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), DuplicateSamplesCheck()])
    assert (np.random.random(), random.random()) == before  # the user's RNG streams are put back
    found = [issue for _, issue in report.issues() if issue.code == "DATA_IDENTICAL"]
    if per_item:
        assert not found
    else:
        assert "numpy.random.default_rng(7) for dataset[0] and again for dataset[1]" in found[0].message
        assert "default_rng(self.seed + idx)" in found[0].fix


@pytest.mark.parametrize("scaled", [True, False], ids=["to_tensor_then_long", "from_numpy"])
def test_label_maps_all_zero_after_a_to_tensor_scaling_name_the_conversion(scaled):
    from torch.utils.data import TensorDataset

    from optimus_preflight.preflight import run_preflight
    from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, TargetsCheck
    from optimus_preflight.preflight.data_access.samples import input_digests

    g = torch.Generator().manual_seed(0)
    images = torch.rand(256, 1, 8, 8, generator=g)
    masks = (images[:, 0] * 4).long().clamp(max=3)  # class ids 0..3 per pixel, as uint8 PNGs hold them
    if scaled:
        masks = (masks.to(torch.uint8).float() / 255).long()  # ToTensor divides uint8 by 255; .long() truncates
    # The int64 (B, H, W) mask takes more bytes than the float32 (B, 1, H, W) image, not more values:
    # the image, the field whose rows differ, is the input.
    assert input_digests((images[:16], masks[:16])) == input_digests((images[:16],))
    model = nn.Conv2d(1, 4, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(images, masks), batch_size=16, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck(),
                                                                  DuplicateSamplesCheck()])
    codes = {issue.code: issue for _, issue in report.issues() if issue.severity.value == "warning"}
    if scaled:
        assert "ToTensor()/to_tensor" in codes["TARGET_ONE_CLASS"].message
        assert "PILToTensor()" in codes["TARGET_ONE_CLASS"].fix and "DATA_IDENTICAL" not in codes
    else:
        assert not codes
