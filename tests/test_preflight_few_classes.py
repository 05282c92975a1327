"""TARGET_FEW_CLASSES: a classifier whose training labels use at most half of its head's classes."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import TargetsCheck


def graded_table(rows: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(rows, 10, generator=generator)
    grades = torch.bucketize(x[:, 0] + 0.5 * x[:, 1], torch.tensor([-0.8, 0.0, 0.8]))  # 4 grades
    return x, grades


def report_for(labels: torch.Tensor, x: torch.Tensor, classes: int = 4, shuffle: bool = True, val=None):
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, classes))
    loader = DataLoader(TensorDataset(x, labels), batch_size=32, shuffle=shuffle,
                        generator=torch.Generator().manual_seed(0))
    val_loader = DataLoader(TensorDataset(*val), batch_size=64) if val is not None else None
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, val_loader=val_loader,
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), TargetsCheck()])
    return report.check("step.targets")


def test_labels_scaled_with_the_table_and_cast_back_use_two_of_four_classes():
    # 400 rows: the scan reads the whole epoch, so no time budget decides the verdict.
    x, grades = graded_table(400, torch.Generator().manual_seed(0))
    table = torch.cat([x, grades.float()[:, None]], 1)
    scaled = (table - table.min(0).values) / (table.max(0).values - table.min(0).values)  # label column too
    result = report_for(scaled[:, -1].long(), scaled[:, :-1])
    issues = [i for i in result.issues if i.code == "TARGET_FEW_CLASSES"]
    assert len(issues) == 1 and issues[0].severity.value == "warning"
    assert "4 class outputs" in issues[0].message and "only 2 of them (0, 1)" in issues[0].message
    assert "classes 2, 3 are never a target" in issues[0].message and ".long()" in issues[0].message
    assert "scale X only" in issues[0].fix


@pytest.mark.parametrize("rare_share", [0.25, 0.005], ids=["balanced", "two_rare_classes"])
def test_every_class_in_the_labels_is_quiet_even_when_two_are_rare(rare_share):
    g = torch.Generator().manual_seed(1)
    x, _ = graded_table(4000, g)
    draw = torch.rand(4000, generator=g)
    labels = torch.where(draw < rare_share, 2, torch.where(draw < 2 * rare_share, 3, (draw * 100).long() % 2))
    if rare_share < 0.1:  # the first batch holds only 0 and 1: the scan must read on until the rare ones show up
        labels[:32] = labels[:32] % 2
    result = report_for(labels, x, shuffle=False)
    assert not [i for i in result.issues if i.code == "TARGET_FEW_CLASSES"]
    if rare_share < 0.1:
        assert len(result.data["class_scan"]["classes"]) == 3


def test_a_small_epoch_that_lacks_half_the_classes_fires_once_read_whole():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(120, 10, generator=g)
    labels = torch.randint(0, 3, (120,), generator=g)  # 3 of a 10-way head's classes, whole epoch of 120
    result = report_for(labels, x, classes=10)
    issues = [i for i in result.issues if i.code == "TARGET_FEW_CLASSES"]
    assert issues and "the whole training epoch use only 3 of them" in issues[0].message


@pytest.mark.parametrize("offset_missing", [True, False], ids=["task_local_ids", "every_other_id"])
def test_the_lowest_ids_of_a_grown_head_name_a_missing_class_offset(offset_missing):
    # A class-incremental step: 8 outputs after the second task; its 4 classes came as 0..3 (no offset).
    g = torch.Generator().manual_seed(3)
    x = torch.randn(400, 10, generator=g)
    labels = torch.randint(0, 4, (400,), generator=g)
    result = report_for(labels if offset_missing else labels * 2, x, classes=8)
    issues = [i for i in result.issues if i.code == "TARGET_FEW_CLASSES"]
    assert len(issues) == 1
    assert ("task-local ids 0..3" in issues[0].message and "n_old_classes" in issues[0].fix) == offset_missing


@pytest.mark.parametrize("split", ["by_position_over_sorted_rows", "random_permutation"])
def test_classes_that_only_validation_has_name_a_split_by_position(split):
    g = torch.Generator().manual_seed(4)
    x, grades = graded_table(400, g)
    order = grades.argsort(stable=True)  # the table as exported: grouped by grade
    x, grades = x[order], grades[order]
    rows = torch.arange(400) if split == "by_position_over_sorted_rows" else torch.randperm(400, generator=g)
    train, val = rows[:200], rows[200:]
    result = report_for(grades[train], x[train], val=(x[val], grades[val]))
    issues = [i for i in result.issues if i.code == "TARGET_FEW_CLASSES"]
    assert len(issues) == (split == "by_position_over_sorted_rows")
    if issues:
        assert "the validation labels hold classes 2, 3" in issues[0].message and "torch.randperm" in issues[0].fix
