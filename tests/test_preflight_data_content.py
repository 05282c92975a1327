"""Data judged by content: validation rows identical to training rows although the
split's indices are disjoint (a table with duplicate rows), and a training sampler that
can only draw a handful of the dataset's samples. Each defect is written the way users
write it and run through ``run_preflight``; each has a healthy twin that stays quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import (
    DataLoader,
    RandomSampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    random_split,
)

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.sampler_coverage import SamplerCoverageCheck, expected_distinct
from optimus_preflight.preflight.checks.split_overlap import SplitOverlapCheck
from optimus_preflight.preflight.framework import Findings, Severity

FEATURES, CLASSES = 6, 3


def table(rows: int = 400, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(rows, FEATURES, generator=generator)
    return TensorDataset(features, features[:, :CLASSES].argmax(1))


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))


def check(train_loader, checks, val_loader=None):
    net = model()
    report = run_preflight(net, torch.optim.SGD(net.parameters(), lr=0.1), train_loader, val_loader=val_loader,
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), *(cls() for cls in checks)])
    return report


def result_of(report, name):
    return next(result for result in report.checks if result.name == name)


def loud(report):
    return [(check.name, issue.code, issue.severity.value) for check, issue in report.issues()
            if issue.severity != Severity.INFO]


# ---------------------------------------------------------------- duplicate rows on both sides of a split

def with_duplicates(share: float, rows: int = 400) -> TensorDataset:
    """A table where ``share`` of the rows are copies of others (a scraped set, an
    oversampled CSV appended to itself), in shuffled order."""
    base = table(rows)
    copies = int(rows * share)
    features, labels = base.tensors
    order = torch.randperm(rows + copies, generator=torch.Generator().manual_seed(1))
    return TensorDataset(torch.cat([features, features[:copies]])[order], torch.cat([labels, labels[:copies]])[order])


def split_report(data):
    train, val = random_split(data, [0.8, 0.2], generator=torch.Generator().manual_seed(0))
    return check(DataLoader(train, batch_size=32, shuffle=True), [SplitOverlapCheck],
                 val_loader=DataLoader(val, batch_size=32))


def test_a_table_with_duplicate_rows_leaks_through_a_disjoint_split():
    report = split_report(with_duplicates(0.5))
    assert loud(report) == [("data.split_overlap", "LEAK_SPLIT", "warning")]
    issue = next(issue for _, issue in report.issues())
    assert "indices are disjoint, but the rows they select are not" in issue.message
    assert "drop_duplicates" in issue.fix
    assert result_of(report, "data.split_overlap").data["shared"] > 10


def test_two_tables_each_repeating_its_rows_get_a_note_naming_deduplication():
    # Built apart (two files, two seeds), each drawing its rows from the same 120 distinct
    # ones: no split to redo, the rows themselves repeat.
    distinct = table(120)

    def drawn(rows: int, seed: int) -> TensorDataset:
        picks = torch.randint(0, 120, (rows,), generator=torch.Generator().manual_seed(seed))
        return TensorDataset(*(tensor[picks] for tensor in distinct.tensors))

    # Validation meets training as often as training meets itself: a note that names both readings.
    report = check(DataLoader(drawn(400, 1), batch_size=32, shuffle=True), [SplitOverlapCheck],
                   val_loader=DataLoader(drawn(100, 2), batch_size=32))
    assert loud(report) == []
    issue = next(issue for _, issue in report.issues() if issue.code == "LEAK_SPLIT")
    assert issue.severity.value == "info" and "the data repeats itself" in issue.message
    assert "drop_duplicates" in issue.fix and "few possible inputs" in issue.fix


@pytest.mark.parametrize("share", [0.0, 0.01])
def test_a_split_of_a_table_with_few_or_no_duplicates_is_quiet(share):
    report = split_report(with_duplicates(share))
    assert loud(report) == []
    assert result_of(report, "data.split_overlap").data["validation_read"] > 0


def test_a_task_of_a_few_hundred_possible_samples_overlaps_by_nature_and_is_a_note():
    # Click sessions fixed by (length, start, stride): 220 possible ones, each drawn ~7 times in 1500.
    g = torch.Generator().manual_seed(0)
    length, start, stride = (torch.randint(4, 15, (1800,), generator=g), torch.randint(1, 6, (1800,), generator=g),
                             torch.randint(1, 3, (1800,), generator=g))
    steps = torch.arange(14)
    ids = ((start[:, None] - 1 + stride[:, None] * steps) % 5 + 1) * (steps < length[:, None])
    noisy = torch.randint(0, 2, (1800,), generator=g)
    data = TensorDataset(ids, noisy)
    train, val = torch.utils.data.Subset(data, range(1500)), torch.utils.data.Subset(data, range(1500, 1800))
    report = check(DataLoader(train, batch_size=32, shuffle=True), [SplitOverlapCheck],
                   val_loader=DataLoader(val, batch_size=32))
    assert loud(report) == []
    issue = next(issue for _, issue in report.issues() if issue.code == "LEAK_SPLIT")
    assert issue.severity.value == "info" and "few" in issue.message


def test_splits_drawn_apart_from_one_space_meet_by_chance_and_that_is_a_note():
    # Prompts "[2] a b [3]" with a, b among 45 token ids, each split generated on its own: training
    # meets itself about as often as validation meets training.
    def prompts(rows: int, seed: int) -> TensorDataset:
        g = torch.Generator().manual_seed(seed)
        pairs = torch.randint(4, 49, (rows, 2), generator=g)
        ids = torch.cat([torch.full((rows, 1), 2), pairs, torch.full((rows, 1), 3), torch.zeros(rows, 4).long()], 1)
        return TensorDataset(ids.float(), pairs.sum(1) % 2)

    report = check(DataLoader(prompts(400, 1), batch_size=32, shuffle=True), [SplitOverlapCheck],
                   val_loader=DataLoader(prompts(200, 2), batch_size=32))
    assert loud(report) == []
    issue = next(issue for _, issue in report.issues() if issue.code == "LEAK_SPLIT")
    assert issue.severity.value == "info" and "share samples by chance" in issue.message
    data = result_of(report, "data.split_overlap").data
    assert 0 < data["training_twins_share"] < 0.3 and data["shared"] >= 3


def test_padded_token_rows_of_distinct_texts_are_quiet():
    # Short texts padded to one length share most of their tokens, not all of them.
    generator = torch.Generator().manual_seed(0)
    ids = torch.zeros(300, 24, dtype=torch.long)
    lengths = torch.randint(3, 10, (300,), generator=generator)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(1, 500, (int(length),), generator=generator)
    data = TensorDataset(ids, torch.randint(0, 2, (300,), generator=generator))
    train, val = random_split(data, [0.8, 0.2], generator=torch.Generator().manual_seed(0))
    net = nn.Sequential(nn.Embedding(500, 8), nn.Flatten(), nn.Linear(24 * 8, 2))
    report = run_preflight(net, torch.optim.SGD(net.parameters(), lr=0.1), DataLoader(train, batch_size=16, shuffle=True),
                           val_loader=DataLoader(val, batch_size=16), loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), SplitOverlapCheck()])
    assert loud(report) == []


# ---------------------------------------------------------------- samplers that reach a few samples

def imbalanced(rows: int = 600, minority: float = 0.05) -> TensorDataset:
    data = table(rows)
    labels = (torch.rand(rows, generator=torch.Generator().manual_seed(2)) < minority).long()
    return TensorDataset(data.tensors[0], labels)


def test_class_weights_given_to_weighted_random_sampler():
    data = imbalanced()
    labels = data.tensors[1]
    class_weights = 1.0 / torch.bincount(labels).float()
    sampler = WeightedRandomSampler(class_weights, num_samples=len(data))  # the bug: per class, not per sample
    report = check(DataLoader(data, batch_size=32, sampler=sampler), [SamplerCoverageCheck])
    assert loud(report) == [("data.sampler_coverage", "SAMPLER_COVERAGE", "error")]
    issue = next(issue for _, issue in report.issues())
    assert "2 weights but the training dataset has 600 samples" in issue.message
    assert "class_weights[labels]" in issue.fix
    # The printed fix works where it fired.
    fixed = WeightedRandomSampler(class_weights[labels], num_samples=len(labels))
    assert loud(check(DataLoader(data, batch_size=32, sampler=fixed), [SamplerCoverageCheck])) == []


def test_a_sampler_stuck_on_a_few_indices_is_measured():
    class FirstFew(torch.utils.data.Sampler):
        """A custom sampler whose range is wrong: it should span len(dataset)."""

        def __init__(self, size: int):
            self.size = size

        def __len__(self) -> int:
            return self.size

        def __iter__(self):
            return iter(torch.randint(0, 8, (self.size,)).tolist())

    data = table(500)
    report = check(DataLoader(data, batch_size=25, sampler=FirstFew(len(data))), [SamplerCoverageCheck])
    assert loud(report) == [("data.sampler_coverage", "SAMPLER_COVERAGE", "error")]
    result = result_of(report, "data.sampler_coverage")
    assert result.data["distinct"] <= 8 and result.data["draws"] == 1000  # two epochs


@pytest.mark.parametrize("make", [
    lambda data: dict(shuffle=True),
    lambda data: dict(sampler=RandomSampler(data, replacement=True)),
    lambda data: dict(sampler=SubsetRandomSampler(range(0, len(data), 2))),
    lambda data: dict(sampler=WeightedRandomSampler(
        (1.0 / torch.bincount(data.tensors[1]).float())[data.tensors[1]], num_samples=len(data))),
], ids=["shuffle", "with-replacement", "subset", "per-sample-weights"])
def test_healthy_samplers_are_quiet(make):
    data = imbalanced(minority=0.01)
    report = check(DataLoader(data, batch_size=32, **make(data)), [SamplerCoverageCheck])
    assert loud(report) == []


def test_balancing_an_extremely_skewed_dataset_is_quiet():
    # Nine classes of ten samples beside one of 9,910, balanced by per-sample weights: the
    # majority is drawn a tenth as often, the minorities a hundred times each.
    labels = torch.cat([torch.zeros(9910, dtype=torch.long), torch.arange(1, 10).repeat_interleave(10)])
    data = TensorDataset(torch.randn(len(labels), FEATURES), labels)
    weights = (1.0 / torch.bincount(labels).float())[labels]
    report = check(DataLoader(data, batch_size=100, sampler=WeightedRandomSampler(weights, len(labels))),
                   [SamplerCoverageCheck])
    assert loud(report) == []


def test_a_debugging_subset_left_in_the_sampler_fires():
    # Each epoch draws 48 distinct indices, as uniform draws would; only across epochs is
    # it plain that they are always the same 48 of 6,000.
    data = table(6000)
    report = check(DataLoader(data, batch_size=16, sampler=SubsetRandomSampler(range(48))), [SamplerCoverageCheck])
    assert loud(report) == [("data.sampler_coverage", "SAMPLER_COVERAGE", "error")]
    assert result_of(report, "data.sampler_coverage").data["distinct"] == 48


def test_every_epoch_the_same_small_subset_is_a_warning_unless_validation_takes_the_rest():
    data = table(600)
    fifth = SubsetRandomSampler(range(0, len(data), 5))  # 120 of 600, every epoch
    report = check(DataLoader(data, batch_size=16, sampler=fifth), [SamplerCoverageCheck])
    assert loud(report) == [("data.sampler_coverage", "SAMPLER_COVERAGE", "warning")]
    issue = next(issue for _, issue in report.issues() if issue.code == "SAMPLER_COVERAGE")
    assert "same 120 of the dataset's 600 samples (20.0%)" in issue.message and "a prefix" not in issue.message
    # The first quarter of a dataset stored in an order: named as a prefix.
    quarter = SubsetRandomSampler(range(len(data) // 4))
    issue = next(issue for _, issue in check(DataLoader(data, batch_size=16, sampler=quarter),
                                             [SamplerCoverageCheck]).issues() if issue.code == "SAMPLER_COVERAGE")
    assert "the first 150 indices (range(150)" in issue.message
    # The same sampler as the training side of a 20/80 split over one dataset: quiet.
    rest = SubsetRandomSampler([i for i in range(len(data)) if i % 5])
    report = check(DataLoader(data, batch_size=16, sampler=fifth), [SamplerCoverageCheck],
                   val_loader=DataLoader(data, batch_size=16, sampler=rest))
    assert loud(report) == []
    # The fix it prints: the dataset itself as the subset.
    subset = torch.utils.data.Subset(data, range(0, len(data), 5))
    assert loud(check(DataLoader(subset, batch_size=16, shuffle=True), [SamplerCoverageCheck])) == []


class BucketBatches(torch.utils.data.Sampler):
    """Batches of similar length, one bucket after another; ``first_only``: the bug, a
    ``return`` inside the loop over buckets."""

    def __init__(self, lengths: torch.Tensor, batch_size: int, first_only: bool = False):
        self.buckets = [torch.nonzero(lengths == value).flatten().tolist() for value in lengths.unique().tolist()]
        self.batch_size, self.first_only = batch_size, first_only

    def __len__(self) -> int:
        return sum(-(-len(bucket) // self.batch_size) for bucket in self.buckets)

    def __iter__(self):
        for bucket in self.buckets:
            order = torch.randperm(len(bucket)).tolist()
            for start in range(0, len(bucket), self.batch_size):
                yield [bucket[i] for i in order[start:start + self.batch_size]]
            if self.first_only:
                return


class SameBucketBatches(BucketBatches):
    """The bug: ``yield self.buckets[0]`` for every bucket drawn (a typo for buckets[b])."""

    def __len__(self) -> int:
        return len(self.buckets)

    def __iter__(self):
        for _ in torch.randperm(len(self.buckets)).tolist():
            yield self.buckets[0]


def test_a_batch_sampler_that_yields_one_batch_every_time_fires():
    data = table(640)
    buckets = torch.arange(640) // 32  # twenty buckets of 32
    report = check(DataLoader(data, batch_sampler=SameBucketBatches(buckets, 32)), [SamplerCoverageCheck])
    assert loud(report) == [("data.sampler_coverage", "SAMPLER_COVERAGE", "error")]
    assert result_of(report, "data.sampler_coverage").data["distinct"] == 32


@pytest.mark.parametrize("first_only", [True, False], ids=["first-bucket-only", "every-bucket"])
def test_a_batch_sampler_that_ends_its_epoch_early(first_only):
    data = table(400)
    lengths = torch.arange(400) % 4  # four buckets of 100
    loader = DataLoader(data, batch_sampler=BucketBatches(lengths, 10, first_only))
    report = check(loader, [SamplerCoverageCheck])
    if first_only:
        assert loud(report) == [("data.sampler_coverage", "SAMPLER_COVERAGE", "warning")]
        issue = next(issue for _, issue in report.issues() if issue.code == "SAMPLER_COVERAGE")
        assert "after 10 batches (100 samples of 400), though its len() is 40" in issue.message
    else:
        assert loud(report) == []


def test_one_ranks_shard_without_set_epoch_is_quiet_in_a_run_of_that_size():
    data = table(600)
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=4, rank=1, shuffle=True)
    findings = Findings()
    assert not SamplerCoverageCheck._replicas_not_the_run([sampler], 4, len(data), findings)
    assert not findings.issues


def test_a_distributed_sampler_for_8_ranks_in_one_process_is_an_error():
    # Kept from an 8-GPU launcher in a single-process script: each epoch trains on 1/8.
    data = table(600)
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=8, rank=0, shuffle=True)
    report = check(DataLoader(data, batch_size=16, sampler=sampler), [SamplerCoverageCheck])
    assert loud(report) == [("data.sampler_coverage", "SAMPLER_COVERAGE", "error")]
    issue = next(issue for _, issue in report.issues() if issue.code == "SAMPLER_COVERAGE")
    assert "num_replicas=8, rank=0 but this run has 1 process(es)" in issue.message and "75 of 600" in issue.message
    assert "shuffle=True" in issue.fix


def test_drawing_leaves_the_loaders_order_unchanged():
    data = imbalanced()
    weights = (1.0 / torch.bincount(data.tensors[1]).float())[data.tensors[1]]

    def epoch_after(run_check: bool) -> list[torch.Tensor]:
        sampler = WeightedRandomSampler(weights, len(data), generator=torch.Generator().manual_seed(3))
        loader = DataLoader(data, batch_size=32, sampler=sampler)
        torch.manual_seed(0)
        if run_check:
            check(loader, [SamplerCoverageCheck])
        return [batch[0] for batch in loader]

    assert all(torch.equal(a, b) for a, b in zip(epoch_after(True), epoch_after(False), strict=True))


def test_expected_distinct():
    assert expected_distinct(1000, 1) == pytest.approx(1.0)
    assert expected_distinct(1000, 1000) == pytest.approx(632.3, abs=0.5)


def test_blank_images_in_both_splits_are_not_a_leak():
    # A fifth of the images are blank (a "background" class): identical, and no leak.
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(300, 1, 8, 8, generator=generator)
    labels = torch.randint(1, 4, (300,), generator=generator)
    images[::5], labels[::5] = 0.0, 0
    data = TensorDataset(images, labels)
    train, val = random_split(data, [0.8, 0.2], generator=torch.Generator().manual_seed(0))
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 4))
    report = run_preflight(net, torch.optim.SGD(net.parameters(), lr=0.1), DataLoader(train, batch_size=16, shuffle=True),
                           val_loader=DataLoader(val, batch_size=16), loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), SplitOverlapCheck()])
    assert loud(report) == []
    assert result_of(report, "data.split_overlap").data["shared"] == 0


# ---------------------------------------------------------------- any iterable of batches
@pytest.mark.parametrize("as_dicts", [False, True], ids=["tuples", "dicts"])
def test_a_plain_list_of_batches_runs_every_check_without_a_crash(as_dicts):
    """run_preflight takes any iterable of batches: the checks that read DataLoader
    attributes (pin_memory, dataset, batch_size, sampler) say so and step aside."""
    data = table(128)
    batches = [(data.tensors[0][i:i + 16], data.tensors[1][i:i + 16]) for i in range(0, 128, 16)]
    loss = nn.CrossEntropyLoss()
    if as_dicts:
        batches = [{"x": x, "y": y} for x, y in batches]
        loss = lambda model, batch: F.cross_entropy(model(batch["x"]), batch["y"])  # noqa: E731
    net = model()
    report = run_preflight(net, torch.optim.SGD(net.parameters(), lr=0.1), batches, loss_fn=loss)
    crashed = [check.name for check in report.checks if check.status.value == "crashed"]
    assert crashed == [] and loud(report) == [], (crashed, loud(report))


def test_a_shadowed_requires_grad_method_does_not_crash_the_restore():
    # The user's typo `p.requires_grad_ = True` replaces the method with a bool on each
    # parameter; the preflight's snapshot restore must not call it.
    net = model()
    for p in net.parameters():
        p.requires_grad_ = True  # the bug: meant p.requires_grad_(True) after freezing
    report = run_preflight(net, torch.optim.SGD(net.parameters(), lr=0.1), DataLoader(table(), batch_size=32),
                           loss_fn=nn.CrossEntropyLoss())
    assert not [check.name for check in report.checks if check.status.value == "crashed"]


@pytest.mark.parametrize("inverse", [False, True], ids=["class-counts", "inverse-counts"])
def test_balancing_weights_that_grow_with_the_class_count(inverse):
    data = imbalanced()
    counts = torch.bincount(data.tensors[1]).double()
    weights = (1.0 / counts if inverse else counts)[data.tensors[1]]
    sampler = WeightedRandomSampler(weights, len(data), generator=torch.Generator().manual_seed(0))
    report = check(DataLoader(data, batch_size=32, sampler=sampler), [SamplerCoverageCheck])
    if inverse:
        assert loud(report) == []
    else:
        assert loud(report) == [("data.sampler_coverage", "SAMPLER_COVERAGE", "warning")]
        issue = next(issue for _, issue in report.issues() if issue.code == "SAMPLER_COVERAGE")
        assert "grow with the size of their group" in issue.message and "1.0 / class_counts" in issue.fix
