"""A resumed epoch continues in the order the interrupted one had, for any DataLoader
(epoch_replay + BatchStream), and the preflight warns only about samplers that
truly cannot be replayed."""

from __future__ import annotations

import random
import time

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, Sampler, TensorDataset

from optimus_preflight.preflight.checks.batch_checks import SamplingCheck
from optimus_preflight.training import rng
from optimus_preflight.training.loaders import build_loader
from optimus_preflight.training.stream import BatchStream
from tests.conftest import tiny_config
from tests.preflight_support import assert_quiet, codes, make_recipe, run

SAMPLES = 50


def _dataset():
    return TensorDataset(torch.arange(SAMPLES).float())


def _collate_pairs(batch):
    """A collate_fn that is not default_collate: a dict of a stacked tensor and a list."""
    values = torch.stack([item[0] for item in batch])
    return {"values": values, "ids": [int(v) for v in values]}


class OwnGeneratorSampler(Sampler[int]):
    """A custom sampler drawing from a torch.Generator it keeps: replayable."""

    def __init__(self, n: int, seed: int = 0):
        self.n = n
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=self.generator).tolist())


class OwnGeneratorBatchSampler(Sampler[list[int]]):
    """A custom batch sampler (P groups x K samples, as metric learning draws them) keeping its
    torch.Generator under a name of its own: replayable once that generator is recorded."""

    def __init__(self, n: int, seed: int = 0):
        self.n, self.g = n, torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.n // 4

    def __iter__(self):
        for _ in range(len(self)):
            groups = torch.randperm(5, generator=self.g)[:2]
            yield (groups.repeat_interleave(2) * 10 + torch.randint(0, 10, (4,), generator=self.g)).tolist()


class ClockSeededSampler(OwnGeneratorSampler):
    """Seeds itself from the clock at every epoch: no recorded state can replay it."""

    def __iter__(self):
        generator = torch.Generator().manual_seed(time.perf_counter_ns())
        return iter(torch.randperm(self.n, generator=generator).tolist())


LOADERS = {
    "shuffle": lambda workers: DataLoader(_dataset(), batch_size=4, shuffle=True, num_workers=workers),
    "shuffle+generator": lambda workers: DataLoader(
        _dataset(), batch_size=4, shuffle=True, num_workers=workers, generator=torch.Generator().manual_seed(3)
    ),
    "random_sampler+collate": lambda workers: DataLoader(
        _dataset(), batch_size=4, sampler=RandomSampler(_dataset()), num_workers=workers, collate_fn=_collate_pairs
    ),
    "no_auto_batching": lambda workers: DataLoader(_dataset(), batch_size=None, sampler=RandomSampler(_dataset()), num_workers=workers),
    "custom_sampler": lambda workers: DataLoader(_dataset(), batch_size=4, sampler=OwnGeneratorSampler(SAMPLES), num_workers=workers),
    "custom_batch_sampler": lambda workers: DataLoader(_dataset(), batch_sampler=OwnGeneratorBatchSampler(SAMPLES),
                                                       num_workers=workers),
    "build_loader": lambda workers: build_loader(_dataset(), tiny_config(f"data.num_workers={workers}").data, train=True, seed=0),
}


def _values(batch):
    batch = batch["values"] if isinstance(batch, dict) else batch
    batch = batch[0] if isinstance(batch, (list, tuple)) else batch
    return batch.tolist()


def _consume(stream: BatchStream, steps: int) -> list:
    """What a training loop does: windows, a commit after each step, and the model's
    own draws from the global RNG (dropout) between fetches."""
    seen = []
    for _ in range(steps):
        for batch, _last in stream.window():
            seen.append(_values(batch))
            torch.rand(7)
            random.random()
        stream.commit()
    return seen


STEPS = 30  # two accumulation micro-batches per step: several epochs of 13 batches


# Workers draw the base seed too; two loader kinds cover that path (each iterator
# starts worker processes, the slow part of these tests).
CASES = [(kind, 0) for kind in LOADERS] + [("shuffle", 2), ("random_sampler+collate", 2)]


@pytest.mark.parametrize("kind, workers", CASES, ids=[f"{kind}-{workers}w" for kind, workers in CASES])
def test_resume_mid_epoch_continues_the_same_order(kind, workers):
    make = LOADERS[kind]
    torch.manual_seed(0)
    reference = _consume(BatchStream(make(workers), 2), STEPS)
    for stop in (1, 6, 7, 13) if not workers else (6, 13):  # mid-epoch, at an epoch's end, in a later epoch
        torch.manual_seed(0)
        first = BatchStream(make(workers), 2)
        before = _consume(first, stop)
        checkpoint, boundary = first.state_dict(), rng.capture()
        # A new process: its RNGs and the new loader's generator have another history.
        torch.manual_seed(1234)
        random.seed(99)
        resumed = BatchStream(make(workers), 2)
        resumed.load_state_dict(checkpoint)
        rng.restore(boundary)
        assert before + _consume(resumed, STEPS - stop) == reference, f"resumed after step {stop}"


def test_the_order_state_survives_a_weights_only_checkpoint(tmp_path):
    stream = BatchStream(LOADERS["shuffle"](0), 1)
    _consume(stream, 3)
    torch.save(stream.state_dict(), tmp_path / "position.pt")
    loaded = torch.load(tmp_path / "position.pt", weights_only=True)
    assert loaded["samples_consumed"] == 12 and set(loaded["order"]) == {"rng", "generators"}


def test_a_resume_skips_by_index_without_loading_the_consumed_samples():
    class CountingDataset(TensorDataset):
        reads = 0

        def __getitem__(self, index):
            CountingDataset.reads += 1
            return super().__getitem__(index)

    make = lambda: DataLoader(CountingDataset(torch.arange(SAMPLES).float()), batch_size=4, shuffle=True)  # noqa: E731
    first = BatchStream(make(), 1)
    _consume(first, 10)
    resumed = BatchStream(make(), 1)
    resumed.load_state_dict(first.state_dict())
    CountingDataset.reads = 0
    _consume(resumed, 1)
    assert CountingDataset.reads == 4  # the next batch only, not the 40 samples before it


def test_build_loader_takes_collate_fn_and_other_dataloader_options():
    cfg = tiny_config("data.num_workers=0").data
    loader = build_loader(_dataset(), cfg, train=True, seed=0, collate_fn=_collate_pairs, timeout=0)
    batch = next(iter(loader))
    assert set(batch) == {"values", "ids"} and len(batch["ids"]) == cfg.batch_size
    with pytest.raises(TypeError, match="shuffle"):
        build_loader(_dataset(), cfg, train=True, seed=0, shuffle=True)


def _sampling(tmp_path, loader):
    return run(make_recipe(tmp_path, loader=loader), SamplingCheck)["data.sampling"]


@pytest.mark.parametrize("kind", ["shuffle", "shuffle+generator", "custom_sampler", "custom_batch_sampler"])
def test_ordinary_loaders_get_no_resume_warning(tmp_path, kind):
    loader = {
        "shuffle": lambda data: DataLoader(data, batch_size=8, shuffle=True),
        "shuffle+generator": lambda data: DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0)),
        "custom_sampler": lambda data: DataLoader(data, batch_size=8, sampler=OwnGeneratorSampler(len(data))),
        # its generator is an attribute of the batch sampler, named g: recorded like any other
        "custom_batch_sampler": lambda data: DataLoader(data, batch_sampler=OwnGeneratorBatchSampler(len(data))),
    }[kind]
    result = _sampling(tmp_path, loader)
    assert_quiet(result)
    assert "RESUME_ORDER" not in codes(result)


def test_a_sampler_that_cannot_be_replayed_is_named(tmp_path):
    result = _sampling(tmp_path, lambda data: DataLoader(data, batch_size=8, sampler=ClockSeededSampler(len(data))))
    assert codes(result) == {"RESUME_ORDER"} and result.status.value == "warning"
    issue = result.issues[0]
    assert "ClockSeededSampler" in issue.message and "torch.Generator" in issue.fix


class EpochCountingSampler(OwnGeneratorSampler):
    """Reseeds from a seed and its own epoch counter at every epoch (a PK sampler's habit)."""

    def __init__(self, n: int, seed: int = 0):
        super().__init__(n, seed)
        self.seed, self.epoch = seed, 0

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        self.epoch += 1
        return iter(torch.randperm(self.n, generator=generator).tolist())


def test_a_sampler_ordered_by_its_own_epoch_counter_gets_a_note(tmp_path):
    result = _sampling(tmp_path, lambda data: DataLoader(data, batch_size=8, sampler=EpochCountingSampler(len(data))))
    assert codes(result) == {"RESUME_ORDER"} and result.status.value == "passed"
    issue = result.issues[0]
    assert issue.severity.value == "info" and "its own fields (epoch)" in issue.message
    assert "set_epoch" in issue.fix


def test_a_checkpoint_naming_the_sampler_as_batch_samplers_still_resumes():
    """Earlier checkpoints named a no-auto-batching loader's sampler generator 'batch_sampler.sampler.generator'."""
    from optimus_preflight.training.epoch_replay import capture_order, order_replayed

    def make():
        return DataLoader(_dataset(), batch_size=None,
                          sampler=RandomSampler(_dataset(), generator=torch.Generator().manual_seed(5)))

    order = capture_order(make())
    assert set(order["generators"]) == {"sampler.generator"}
    order["generators"] = {"batch_sampler.sampler.generator": order["generators"]["sampler.generator"]}
    loader = make()
    next(iter(loader.sampler))  # the new process's generator has another history
    with order_replayed(loader, order):
        replayed = list(loader.sampler)
    assert replayed == list(make().sampler)
