"""Dataset-correctness checks: each fires on a dataset or loader broken the way users break
them (a lambda under spawn, a dataclass batch with pin_memory, a wrong __len__, an
unbounded cache, uneven shards across ranks) and stays quiet on healthy ones."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
import textwrap
from collections import namedtuple

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset
from torch.utils.data._utils.collate import default_collate
from torch.utils.data._utils.pin_memory import pin_memory as torch_pin_memory

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks import dataset_memory, shard_checks, worker_pickling
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.dataset_checks import DatasetLengthCheck, index_modulo
from optimus_preflight.preflight.checks.dataset_memory import DatasetCacheCheck, cached_samples, steady_growth
from optimus_preflight.preflight.checks.pin_checks import PinnedBatchCheck, Unpinned, unpinnable_parts
from optimus_preflight.preflight.checks.shard_checks import RankBatchesCheck, compare_counts, encode_count
from optimus_preflight.preflight.checks.worker_pickling import WorkerPicklingCheck
from optimus_preflight.preflight.framework import CheckStatus, Severity
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.training.distributed import DistEnv
from tests.conftest import REPO
from tests.preflight_support import FEATURES, assert_quiet, classification_data, codes, make_recipe, plain_context, run

MIB = 1024**2


def severities(result) -> set[str]:
    return {issue.severity.value for issue in result.issues}


def loader_of(dataset, **options):
    return lambda data: DataLoader(dataset if dataset is not None else data, batch_size=16, **options)


# ----------------------------------------------------------------- DP6: spawn pickling
class Transformed(Dataset):
    """A torchvision-style dataset: samples through a transform given at construction."""

    def __init__(self, transform, samples: int = 64):
        self.data = classification_data(samples)
        self.transform = transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        inputs, target = self.data[index]
        return self.transform(inputs), target


def double(inputs):
    return inputs * 2


def local_dataset():
    class Local(Dataset):  # defined inside a function: pickle cannot name it
        def __len__(self):
            return 64

        def __getitem__(self, index):
            return torch.zeros(FEATURES), 0

    return Local()


def test_a_lambda_collate_fn_under_spawn_is_an_error_naming_it(tmp_path):
    loader = loader_of(None, num_workers=2, collate_fn=lambda batch: default_collate(batch),
                       multiprocessing_context="spawn")
    recipe = make_recipe(tmp_path, loader=loader)
    # What torch 2.13 does with it: the worker's arguments do not pickle, iter() fails.
    with pytest.raises(AttributeError, match="Can't pickle local object"):
        next(iter(recipe.train_loader))
    result = run(recipe, WorkerPicklingCheck)["data.worker_pickling"]
    assert result.status == CheckStatus.ERROR and codes(result) == {"DP6"}
    issue = result.issues[0]
    assert issue.message.startswith("collate_fn (a lambda at test_preflight_dataset_checks.py:")
    assert "spawn start method" in issue.message and "module-level `def`s" in issue.fix
    # make_recipe's own build_dataloaders ignores data.*: the stopgap names the DataLoader argument.
    assert "num_workers=0 on the DataLoader" in issue.fix and issue.config_key is None


@pytest.mark.parametrize(("dataset", "culprit"), [
    (Transformed(lambda inputs: inputs * 2), "dataset.transform (a lambda at test_preflight_dataset_checks.py:"),
    (local_dataset(), "dataset (an instance of the class local_dataset.<locals>.Local, defined inside a function"),
])
def test_an_unpicklable_dataset_under_forkserver_is_found_inside_it(tmp_path, dataset, culprit):
    ctx = plain_context(tmp_path, loader=loader_of(dataset, num_workers=2, multiprocessing_context="forkserver"))
    result = run(ctx, WorkerPicklingCheck)["data.worker_pickling"]
    assert result.status == CheckStatus.ERROR and codes(result) == {"DP6"}
    assert result.issues[0].message.startswith(culprit), result.issues[0].message


def test_under_fork_an_unpicklable_collate_fn_is_only_a_portability_note(tmp_path):
    ctx = plain_context(tmp_path, loader=loader_of(None, num_workers=2, collate_fn=lambda b: default_collate(b),
                                                    multiprocessing_context="fork"))
    result = run(ctx, WorkerPicklingCheck)["data.worker_pickling"]
    assert_quiet(result)
    assert severities(result) == {"info"} and "macOS" in result.issues[0].message


@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_picklable_workers_are_quiet(tmp_path, context):
    dataset = Transformed(functools.partial(torch.mul, other=2))  # partial of a top-level function: fine
    ctx = plain_context(tmp_path, loader=loader_of(dataset, shuffle=True, num_workers=2, worker_init_fn=double,
                                                    multiprocessing_context=context))
    result = run(ctx, WorkerPicklingCheck)["data.worker_pickling"]
    assert_quiet(result)
    assert not result.issues and result.data["start_method"] == context


def test_default_recipe_with_workers_is_quiet(tmp_path):
    recipe = make_recipe(tmp_path, "data.num_workers=2", classification=False)
    result = run(recipe, WorkerPicklingCheck)["data.worker_pickling"]
    assert_quiet(result)
    assert not result.issues
    # The token tensor goes through shared memory under spawn: not counted as pickled bytes.
    assert result.data["dataset_bytes"] < 4096


def test_a_dataset_pickling_to_more_than_the_cap_warns_under_spawn(tmp_path, monkeypatch):
    monkeypatch.setattr(worker_pickling, "PICKLE_CAP_BYTES", MIB)
    dataset = Transformed(double)
    dataset.captions = [f"caption {index}" * 8 for index in range(20_000)]  # ~2 MiB of Python strings
    ctx = plain_context(tmp_path, loader=loader_of(dataset, num_workers=2, multiprocessing_context="spawn"))
    result = run(ctx, WorkerPicklingCheck)["data.worker_pickling"]
    assert result.status == CheckStatus.WARNING and codes(result) == {"DP6"}
    assert "the dataset pickles to more than 1 MiB" in result.issues[0].message and "persistent_workers" in result.issues[0].fix


def test_a_class_from_an_interactive_main_is_an_error_under_spawn(tmp_path, monkeypatch):
    notebook_class = type("NotebookDataset", (Transformed,), {"__module__": "__main__"})
    monkeypatch.setattr(sys.modules["__main__"], "NotebookDataset", notebook_class, raising=False)
    monkeypatch.setattr(worker_pickling, "main_is_importable", lambda: False)
    ctx = plain_context(tmp_path, loader=loader_of(notebook_class(double), num_workers=2,
                                                    multiprocessing_context="spawn"))
    result = run(ctx, WorkerPicklingCheck)["data.worker_pickling"]
    assert result.status == CheckStatus.ERROR and "NotebookDataset" in result.issues[0].message
    assert "interactive session" in result.issues[0].message


# ------------------------------------------------------------------ DP5: pinned batches
@dataclasses.dataclass
class Batch:
    inputs: torch.Tensor
    targets: torch.Tensor


def to_batch(samples):
    inputs, targets = default_collate(samples)
    return Batch(inputs, targets)


@dataclasses.dataclass
class PinnableBatch(Batch):
    def pin_memory(self):
        self.inputs, self.targets = self.inputs.pin_memory(), self.targets.pin_memory()
        return self


def to_pinnable_batch(samples):
    return PinnableBatch(*default_collate(samples))


def on_gpu(recipe) -> PreflightContext:
    """The recipe's context as if it trained on a GPU (pinning is a no-op on a CPU run)."""
    ctx = recipe
    ctx.training = dataclasses.replace(ctx.training, device=torch.device("cuda", 0))
    return ctx


def test_a_dataclass_batch_with_pin_memory_is_silently_left_unpinned(monkeypatch):
    pinned = []
    # No accelerator here to pin with: record what torch 2.13's pin step would pin.
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda tensor: pinned.append(tensor.shape) or tensor.clone())
    samples = [(torch.zeros(FEATURES), 0)] * 4
    batch = to_batch(samples)
    # An object it does not know is handed back as it is, without a word...
    assert torch_pin_memory(batch) is batch and pinned == []
    # ...while a tuple of tensors is pinned, and so is a batch with the method DP5's fix adds.
    torch_pin_memory(default_collate(samples))
    assert pinned == [(4, FEATURES), (4,)]
    assert isinstance(torch_pin_memory(to_pinnable_batch(samples)), PinnableBatch) and len(pinned) == 4
    assert unpinnable_parts(batch) == [Unpinned("batch", "Batch", ("inputs", "targets"))]
    assert unpinnable_parts({"graph": batch, "ids": torch.zeros(2)}) == [Unpinned("batch['graph']", "Batch",
                                                                                  ("inputs", "targets"))]
    assert unpinnable_parts(to_pinnable_batch([(torch.zeros(FEATURES), 0)] * 4)) == []


def test_pin_memory_with_a_dataclass_batch_warns_with_the_method_to_add(tmp_path, monkeypatch):
    ctx = plain_context(tmp_path, loader=loader_of(None, collate_fn=to_batch, pin_memory=True))
    result = run(on_gpu(ctx), PinnedBatchCheck)["data.pin_memory"]
    assert result.status == CheckStatus.WARNING and codes(result) == {"DP5"}
    issue = result.issues[0]
    assert "batch is a Batch" in issue.message and "in inputs, targets stay in pageable memory" in issue.message
    method = issue.fix.split("`")[1]
    assert method == ("def pin_memory(self): self.inputs = self.inputs.pin_memory(); "
                      "self.targets = self.targets.pin_memory(); return self")
    # The method as printed, added to Batch, makes torch's pin step pin both tensors.
    namespace = {}
    exec(method, namespace)
    fixed_type = dataclasses.dataclass(type("FixedBatch", (Batch,), {"pin_memory": namespace["pin_memory"]}))
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda tensor: pinned.append(tensor.shape) or tensor.clone())
    fixed = fixed_type(torch.zeros(4, FEATURES), torch.zeros(4))
    assert torch_pin_memory(fixed) is fixed and pinned == [(4, FEATURES), (4,)]


@pytest.mark.parametrize(("collate_fn", "pin", "gpu"), [
    (to_pinnable_batch, True, True),  # the fix
    (default_collate, True, True),  # a tuple of tensors
    (to_batch, False, True),  # nothing asks for pinning
    (to_batch, True, False),  # a CPU run pins nothing
])
def test_pinnable_batches_are_quiet(tmp_path, collate_fn, pin, gpu):
    ctx = plain_context(tmp_path, loader=loader_of(None, collate_fn=collate_fn, pin_memory=pin))
    result = run(on_gpu(ctx) if gpu else ctx, PinnedBatchCheck)["data.pin_memory"]
    assert_quiet(result)


# ------------------------------------------------------------------ DP7: __len__ contract
class Items(Dataset):
    """A list-backed dataset whose __len__ may disagree with its list."""

    def __init__(self, stored: int, length: int, wrap: bool = False):
        self.items = [torch.full((FEATURES,), float(index)) for index in range(stored)]
        self.length = length
        self.wrap = wrap

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        if self.wrap:
            return self.items[index % len(self.items)], 0
        return self.items[index], 0


class Modulo(Dataset):
    def __init__(self, samples: int = 64):
        self.data = classification_data(samples)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, idx):
        idx = idx % len(self.data)
        return self.data[idx]


class Procedural(Dataset):
    """Generated from the index: any index is valid, none repeats another."""

    def __len__(self):
        return 64

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        return torch.randn(FEATURES, generator=generator), index % 4


class Keyed(Dataset):
    """Backed by a dict: an index past the end raises KeyError."""

    def __init__(self):
        self.rows = {index: (torch.randn(FEATURES), index % 4) for index in range(64)}

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        inputs, target = self.rows[index]
        return inputs, target


class Constant(Dataset):
    """Dummy data for a benchmark: the same sample at every index."""

    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.ones(FEATURES), 1


class Flips(Dataset):
    """A modulo that decides an augmentation, not which item: no wraparound."""

    def __init__(self):
        self.data = classification_data(64)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        inputs, target = self.data[index]
        return (inputs.flip(0) if index % 2 else inputs), target


def test_a_len_past_the_data_is_an_epoch_end_crash(tmp_path):
    # An off-by-one: the first batches are fine, the last index of every epoch is not.
    ctx = plain_context(tmp_path, dataset=Items(stored=255, length=256), loader=loader_of(None, shuffle=True))
    result = run(ctx, DatasetLengthCheck)["data.dataset_length"]
    assert result.status == CheckStatus.ERROR and codes(result) == {"DP7"}
    assert "dataset[255]" in result.issues[0].message and "IndexError" in result.issues[0].message


@pytest.mark.parametrize(("dataset", "says"), [
    (Items(stored=60, length=64, wrap=True), "`index % len(self.items)` in __getitem__"),  # len over-reports, wrapped
    (Modulo(), "dataset[64] equals dataset[0]"),  # a defensive modulo by the length itself
])
def test_a_wrapping_index_warns(tmp_path, dataset, says):
    result = run(plain_context(tmp_path, dataset=dataset), DatasetLengthCheck)["data.dataset_length"]
    assert result.status == CheckStatus.WARNING and codes(result) == {"DP7"}
    assert says in result.issues[0].message and "IndexError" in result.issues[0].fix


def test_a_len_short_of_the_data_warns(tmp_path):
    result = run(plain_context(tmp_path, dataset=Items(stored=80, length=64)), DatasetLengthCheck)["data.dataset_length"]
    assert result.status == CheckStatus.WARNING and codes(result) == {"DP7"}
    assert "under-reports" in result.issues[0].message and "up to about 79" in result.issues[0].message


def test_a_sliding_window_count_one_short_is_a_note(tmp_path):
    # (n - window) // stride windows where one more fits: one window of 65 never drawn, nothing to learn lost
    result = run(plain_context(tmp_path, dataset=Items(stored=65, length=64)), DatasetLengthCheck)["data.dataset_length"]
    assert result.status == CheckStatus.PASSED and codes(result) == {"DP7"}
    assert result.issues[0].severity.value == "info" and "under-reports by 1" in result.issues[0].message
    assert "// stride + 1" in result.issues[0].fix


@pytest.mark.parametrize("dataset", [classification_data(), Items(stored=64, length=64), Procedural(), Constant(), Keyed(),
                                     Flips(),
                                     [{"input_ids": torch.arange(8), "labels": torch.arange(8)}] * 64])
def test_datasets_that_keep_the_length_contract_are_quiet(tmp_path, dataset):
    result = run(plain_context(tmp_path, dataset=dataset, loader=loader_of(None, shuffle=True)),
                 DatasetLengthCheck)["data.dataset_length"]
    assert_quiet(result)
    assert not result.issues


def test_token_windows_of_the_default_recipe_are_quiet(tmp_path):
    # dataset[len] of CharWindows is a short slice of the token tensor, not a sample.
    result = run(make_recipe(tmp_path, classification=False), DatasetLengthCheck)["data.dataset_length"]
    assert_quiet(result)
    assert not result.issues and result.data["serves_index_len"] is False


def test_only_a_modulo_that_picks_the_item_counts():
    assert index_modulo(Modulo()) == f"`idx % len(self.data)` in __getitem__ (test_preflight_dataset_checks.py:{Modulo.__getitem__.__code__.co_firstlineno})"
    assert index_modulo(Flips()) is None and index_modulo(classification_data()) is None


# ------------------------------------------------------------------ DP9: growing caches
class Decoded(Dataset):
    """Each sample "decodes" to a 1 MiB tensor; ``cache`` keeps every decoded sample."""

    def __init__(self, samples: int, cache: bool):
        self.samples = samples
        self.cache = {} if cache else None

    def __len__(self):
        return self.samples

    def __getitem__(self, index):
        if self.cache is not None and index in self.cache:
            return self.cache[index]
        sample = (torch.full((256 * 1024,), float(index)), index % 4)
        if self.cache is not None:
            self.cache[index] = sample
        return sample


def flat_model():
    return nn.Sequential(nn.Linear(256 * 1024, 4))


Memory = namedtuple("Memory", "total available")


def cache_run(tmp_path, monkeypatch, dataset, available_gib: float, *overrides):
    monkeypatch.setattr(dataset_memory.psutil, "virtual_memory",
                        lambda: Memory(2 * available_gib * 1024**3, available_gib * 1024**3))
    # 20,000 steps x 16 samples: the run reads the whole 50,000-sample epoch.
    ctx = plain_context(tmp_path, "trainer.max_steps=20000", *overrides, model=flat_model, dataset=dataset,
                         loader=loader_of(None, shuffle=True))
    return run(ctx, DatasetCacheCheck)["data.dataset_cache"]


@pytest.mark.parametrize(("available_gib", "status"), [(30.0, CheckStatus.ERROR), (80.0, CheckStatus.WARNING),
                                                       (500.0, CheckStatus.PASSED)])
def test_a_dataset_caching_every_sample_is_projected_to_the_epoch(tmp_path, monkeypatch, available_gib, status):
    result = cache_run(tmp_path, monkeypatch, Decoded(50_000, cache=True), available_gib)
    # 1 MiB retained per sample read, in each round; 50,000 samples ~ 48.8 GiB.
    assert all(growth >= 15 * MIB for growth in result.data["retained_per_round"])
    assert 0.95 * MIB < result.data["retained_per_sample"] < 1.2 * MIB
    assert result.status == status
    if status != CheckStatus.PASSED:
        assert codes(result) == {"DP9"} and "lru_cache" in result.issues[0].fix
        assert "its caches hold 50000 samples" in result.issues[0].message


class BoundedCache(Decoded):
    """DP9's fix: at most 8 decoded samples kept."""

    def __init__(self, samples: int):
        super().__init__(samples, cache=False)
        self.decode = functools.lru_cache(maxsize=8)(super().__getitem__)

    def __getitem__(self, index):
        return self.decode(index)


@pytest.mark.parametrize("dataset", [Decoded(50_000, cache=False), BoundedCache(50_000)])
def test_a_dataset_that_allocates_without_keeping_is_quiet(tmp_path, monkeypatch, dataset):
    result = cache_run(tmp_path, monkeypatch, dataset, 1.0)
    assert_quiet(result)
    assert result.data["summary"] == "no steady growth while reading samples"


class Mapped(Dataset):
    """The catalog's fix: samples sliced from a memory-mapped file (page cache, not heap)."""

    def __init__(self, path):
        self.rows = np.load(path, mmap_mode="r")

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return torch.from_numpy(np.array(self.rows[index])), index % 4


def test_a_memory_mapped_dataset_is_quiet_though_its_rss_grows(tmp_path, monkeypatch):
    path = tmp_path / "rows.npy"
    np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(2000, 256 * 1024 // 4))[:] = 1.0
    dataset = Mapped(path)  # reading a fresh row pages in 256 KiB of the file: RSS grows, anonymous memory not
    monkeypatch.setattr(dataset_memory.psutil, "virtual_memory", lambda: Memory(2 * 1024**3, 1024**3))
    ctx = plain_context(tmp_path, "trainer.max_steps=20000", model=lambda: nn.Linear(256 * 1024 // 4, 4),
                         dataset=dataset, loader=loader_of(None, shuffle=True))
    result = run(ctx, DatasetCacheCheck)["data.dataset_cache"]
    assert_quiet(result)
    assert result.data["summary"] == "no steady growth while reading samples"


def test_default_recipe_and_a_tensor_dataset_keep_nothing(tmp_path):
    for recipe in (make_recipe(tmp_path, classification=False), make_recipe(tmp_path, dataset=classification_data(4096))):
        result = run(recipe, DatasetCacheCheck)["data.dataset_cache"]
        assert_quiet(result)
        assert not result.issues


def test_retention_must_repeat_in_every_round():
    assert steady_growth([16 * MIB, 16 * MIB, 16 * MIB])
    assert not steady_growth([MIB, 0, 0])  # first touch of an allocator pool
    assert not steady_growth([8 * MIB, 2 * MIB, MIB])  # a pool filling up, then not
    assert not steady_growth([20_000, 20_000, 20_000])  # below what RSS can tell


def test_persistent_workers_each_keep_a_copy():
    assert cached_samples(1000, planned=10_000, workers=0, persistent=False) == 1000
    assert cached_samples(1000, planned=10_000, workers=4, persistent=False) == 1000  # restarted every epoch
    assert cached_samples(1000, planned=10_000, workers=4, persistent=True) == 4000
    assert cached_samples(1000, planned=500, workers=4, persistent=True) == 500  # the run ends first


# ------------------------------------------------------------------ DP3: uneven shards
def test_counts_compare_whole_epochs_and_lower_bounds():
    exact, capped, unknown = encode_count(13, True), encode_count(50, False), encode_count(None, False)
    assert compare_counts([exact, exact]) == shard_checks.ShardVerdict(False, True, "rank 0: 13, rank 1: 13")
    assert compare_counts([exact, encode_count(12, True)]).uneven
    assert compare_counts([exact, capped]).uneven  # the capped rank already read more than 13
    assert not compare_counts([encode_count(60, True), capped]).uneven  # 60 vs at least 50: unknown
    assert not compare_counts([encode_count(60, True), capped]).verified
    verdict = compare_counts([exact, unknown])
    assert not verdict.uneven and not verdict.verified and verdict.counts == "rank 0: 13, rank 1: not counted"


class Shard(IterableDataset):
    """This rank's part of a stream: ``samples`` items."""

    def __init__(self, samples: int):
        self.samples = samples

    def __iter__(self):
        for index in range(self.samples):
            yield torch.full((FEATURES,), float(index)), index % 4


class FakePeers:
    """The other rank of a two-rank job, through Peers.gather's interface."""

    def __init__(self, other: int):
        self.other = other
        self.posted: list[int] = []

    def gather(self, value, *, during, bound):
        self.posted.append(value)
        return [value, self.other]


def two_rank_run(tmp_path, monkeypatch, samples: int, other: int):
    group = FakePeers(other)
    monkeypatch.setattr(shard_checks, "peers", lambda: group)
    ctx = plain_context(tmp_path, dataset=Shard(samples), loader=loader_of(None))
    ctx.training = dataclasses.replace(ctx.training, dist=DistEnv(rank=0, world_size=2))
    return run(ctx, RankBatchesCheck)["data.rank_batches"], group


@pytest.mark.parametrize(("other", "status"), [(13, CheckStatus.PASSED), (12, CheckStatus.ERROR)])
def test_ranks_with_uneven_batches_per_epoch_fail(tmp_path, monkeypatch, other, status):
    result, group = two_rank_run(tmp_path, monkeypatch, 200, encode_count(other, True))  # 200 / 16: 13 batches
    assert group.posted == [13]
    assert result.status == status
    if status == CheckStatus.ERROR:
        assert codes(result) == {"DP3"} and "rank 0: 13, rank 1: 12" in result.issues[0].message
        assert "Join" in result.issues[0].fix and "drop_last=True" in result.issues[0].fix


def test_a_count_stopped_at_the_cap_is_reported_as_not_verified(tmp_path, monkeypatch):
    monkeypatch.setattr(shard_checks, "COUNT_MAX_BATCHES", 5)
    result, group = two_rank_run(tmp_path, monkeypatch, 200, encode_count(5, False))
    assert group.posted == [encode_count(5, False)]
    assert_quiet(result)
    assert severities(result) == {"info"} and "not verified" in result.issues[0].message
    # A rank whose whole epoch is shorter than what this rank read before the cap: uneven for sure.
    result, _ = two_rank_run(tmp_path, monkeypatch, 200, encode_count(3, True))
    assert result.status == CheckStatus.ERROR and "rank 0: >= 5, rank 1: 3" in result.issues[0].message


def test_a_rank_that_cannot_count_still_posts(tmp_path, monkeypatch):
    class Broken(Shard):
        def __iter__(self):
            yield from super().__iter__()
            raise OSError("shard file vanished")

    result, group = two_rank_run(tmp_path, monkeypatch, 0, encode_count(13, True))
    assert group.posted == [0]  # an empty shard is a count too
    assert result.status == CheckStatus.ERROR
    group = FakePeers(encode_count(13, True))
    monkeypatch.setattr(shard_checks, "peers", lambda: group)
    ctx = plain_context(tmp_path, dataset=Broken(40), loader=loader_of(None))
    ctx.training = dataclasses.replace(ctx.training, dist=DistEnv(rank=0, world_size=2))
    result = run(ctx, RankBatchesCheck)["data.rank_batches"]
    assert group.posted == [shard_checks.UNKNOWN] and "OSError" in result.data["count_error"]
    assert_quiet(result)


def test_a_single_process_and_the_default_recipe_are_quiet(tmp_path):
    result = run(make_recipe(tmp_path, classification=False), RankBatchesCheck)["data.rank_batches"]
    assert_quiet(result)
    assert not result.issues


UNEVEN_SCRIPT = """
import json, sys, torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset
from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.shard_checks import RankBatchesCheck
from optimus_preflight.training.distributed import DistEnv, destroy_process_group, init_process_group

class Shard(IterableDataset):
    def __init__(self, samples):
        self.samples = samples
    def __iter__(self):
        for index in range(self.samples):
            yield torch.randn(4), index % 2

env = DistEnv.from_environment()
init_process_group(env, 60.0)
for extra in (8, 0):  # rank 1 has a batch more, then the same
    samples = 40 + (extra if env.rank == 1 else 0)
    model = nn.Linear(4, 2)
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(Shard(samples), batch_size=8),
                           loss_fn=nn.CrossEntropyLoss(), checks=[RankBatchesCheck()], max_steps=5)
    check = next(c for c in report.checks if c.name == "data.rank_batches")
    # One file per rank and case: two ranks printing to one pipe can interleave their lines.
    with open(f"result_{env.rank}_{extra}.json", "w") as out:
        json.dump({"rank": env.rank, "extra": extra, "status": check.status.value, "data": check.data,
                   "codes": [i.code for i in check.issues]}, out)
destroy_process_group()
"""


@pytest.mark.slow
def test_two_torchrun_ranks_compare_their_batch_counts(tmp_path):
    script = tmp_path / "uneven.py"
    script.write_text(textwrap.dedent(UNEVEN_SCRIPT))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("result_*.json"))]
    assert sorted((r["extra"], r["rank"]) for r in results) == [(0, 0), (0, 1), (8, 0), (8, 1)]
    for result in results:
        uneven = result["extra"] > 0
        assert result["status"] == ("error" if uneven else "passed")
        assert result["data"]["batches_per_rank"] == ("rank 0: 5, rank 1: 6" if uneven else "rank 0: 5, rank 1: 5")
        assert result["codes"] == (["DP3"] if uneven else [])


# ------------------------------------------------------------ all of them, healthy setups
ALL = (WorkerPicklingCheck, PinnedBatchCheck, DatasetLengthCheck, DatasetCacheCheck, RankBatchesCheck)


def test_a_plain_loop_with_a_shuffled_loader_is_quiet(tmp_path):
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 4))
    data = TensorDataset(torch.randn(256, 1, 8, 8), torch.randint(0, 4, (256,)))
    loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=2, pin_memory=True)
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), *(check() for check in ALL)])
    assert [issue for _, issue in report.issues() if issue.severity != Severity.INFO] == []
    assert {check.name: check.status.value for check in report.checks} == {
        "data.first_batch": "passed", **{check.name: "passed" for check in ALL}}


def test_a_hugging_face_model_with_its_collator_is_quiet(tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32))
    rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 97, (64, 16))]  # an HF-style list dataset
    loader = DataLoader(rows, batch_size=8, shuffle=True, num_workers=2, collate_fn=transformers.default_data_collator)
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), lr=1e-3), loader,
                           checks=[FirstBatchCheck(), *(check() for check in ALL)])
    assert [issue for _, issue in report.issues() if issue.severity != Severity.INFO] == []
    assert not report.failed
    # Under spawn too, the collator and the list pickle (checked without starting workers).
    spawned = DataLoader(rows, batch_size=8, num_workers=2, multiprocessing_context="spawn",
                         collate_fn=transformers.default_data_collator)
    assert all(verdict.error is None for verdict in worker_pickling.pickle_worker_arguments(spawned).values())
