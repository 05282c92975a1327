"""model_summary: exact parameter counts and sizes per top-level child, and the table."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from optimus_preflight.reporting.model_summary import (
    ROOT_ROW,
    ModuleRow,
    format_model_summary,
    human_bytes,
    human_count,
    summarize_model,
    write_model_summary,
)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # conv 8*3*3*3 + 8 = 224, batchnorm 8 + 8 (+ buffers: 8 + 8 float32, one int64) = 240 params
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, 10)  # 90


CNN_FEATURES_BYTES = 240 * 4 + 16 * 4 + 8


class FrozenEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))  # on the root
        self.register_buffer("offsets", torch.zeros(5))  # on the root
        self.embed = nn.Embedding(100, 16).requires_grad_(False)  # 1600 frozen
        self.proj = nn.Linear(16, 4)  # 68


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 50, bias=False)
        self.head.weight = self.embed.weight


class Wrapper:
    """DDP-like: only ``.module``."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module


def _rows(summary) -> list[tuple]:
    return [(row.name, row.type, row.trainable, row.frozen, row.bytes) for row in summary.rows]


def test_small_cnn() -> None:
    summary = summarize_model(SmallCNN())
    assert _rows(summary) == [("features", "Sequential", 240, 0, CNN_FEATURES_BYTES), ("head", "Linear", 90, 0, 360)]
    assert (summary.trainable, summary.frozen, summary.total) == (330, 0, 330)
    assert (summary.param_bytes, summary.buffer_bytes, summary.bytes) == (1320, 72, 1392)
    assert summary.model_type == "SmallCNN" and summary.wrappers == ()
    assert format_model_summary(summary) == (
        "module    type        trainable  frozen     size\n"
        "features  Sequential        240       0  1.0 KiB\n"
        "head      Linear             90       0    360 B\n"
        "total                       330       0  1.4 KiB\n"
    )


def test_bf16_halves_the_floating_point_bytes_only() -> None:
    summary = summarize_model(SmallCNN().to(torch.bfloat16))
    # num_batches_tracked stays int64.
    assert summary.param_bytes == 660 and summary.buffer_bytes == 16 * 2 + 8


def test_frozen_embedding_and_tensors_on_the_root() -> None:
    summary = summarize_model(FrozenEmbedding())
    assert _rows(summary) == [
        (ROOT_ROW, "FrozenEmbedding", 3, 0, 3 * 4 + 5 * 4),
        ("embed", "Embedding", 0, 1600, 6400),
        ("proj", "Linear", 68, 0, 272),
    ]
    assert (summary.trainable, summary.frozen, summary.total, summary.bytes) == (71, 1600, 1671, 32 + 6400 + 272)
    assert summary.frozen_modules == ["embed"]
    assert format_model_summary(summary) == (
        "module  type             trainable  frozen     size\n"
        "(root)  FrozenEmbedding          3       0     32 B\n"
        "embed   Embedding                0   1.6 K  6.2 KiB\n"
        "proj    Linear                  68       0    272 B\n"
        "total                           71   1.6 K  6.5 KiB (1 module(s) frozen entirely: embed)\n"
    )


def test_tied_weights_count_once() -> None:
    summary = summarize_model(Tied())
    # The first owner (embed) counts the shared weight; head has nothing of its own left.
    assert _rows(summary) == [
        ("embed", "Embedding", 400, 0, 1600),
        ("body", "Linear", 72, 0, 288),
        ("head", "Linear", 0, 0, 0),
    ]
    assert summary.total == 472 == sum(p.numel() for p in Tied().parameters())
    assert summary.frozen_modules == []


def test_meta_device_model_matches_the_real_one() -> None:
    with torch.device("meta"):
        model = SmallCNN()
    assert next(model.parameters()).is_meta
    assert summarize_model(model) == summarize_model(SmallCNN())


def test_wrappers_are_unwrapped() -> None:
    plain = summarize_model(SmallCNN())
    wrapped = summarize_model(Wrapper(SmallCNN()))
    assert wrapped.rows == plain.rows and wrapped.wrappers == ("Wrapper",)
    parallel = summarize_model(nn.DataParallel(SmallCNN()))  # on the CPU: only holds .module
    assert parallel.rows == plain.rows and parallel.wrappers == ("DataParallel",)
    compiled = torch.compile(Wrapper(SmallCNN()).module)  # compiles lazily: nothing runs here
    summary = summarize_model(Wrapper(compiled))
    assert summary.rows == plain.rows and summary.wrappers == ("Wrapper", "OptimizedModule")
    assert summary.model_type == "SmallCNN"


def test_a_child_called_module_is_not_a_wrapper() -> None:
    model = nn.Module()
    model.module = nn.Linear(2, 2)
    model.other = nn.Linear(2, 1)
    summary = summarize_model(model)
    assert [row.name for row in summary.rows] == ["module", "other"] and summary.wrappers == ()
    with pytest.raises(TypeError, match="nn.Module"):
        summarize_model(object())


def test_many_children_collapse_into_one_row() -> None:
    summary = summarize_model(nn.Sequential(*[nn.Linear(2, 2) for _ in range(25)]))
    text = format_model_summary(summary, max_rows=20)
    lines = text.splitlines()
    assert len(lines) == 1 + 20 + 1 + 1
    assert lines[-2].split() == ["...", "5", "more", "30", "0", "120", "B"]
    assert lines[-1].split() == ["total", "150", "0", "600", "B"]
    assert len({len(line) for line in lines}) == 1  # aligned


@pytest.mark.parametrize(
    ("value", "count", "size"),
    [
        (0, "0", "0 B"),
        (999, "999", "999 B"),
        (1000, "1.0 K", "1000 B"),
        (1024, "1.0 K", "1.0 KiB"),
        (23_450, "23.4 K", "22.9 KiB"),
        (999_950, "1.0 M", "976.5 KiB"),
        (1_048_575, "1.0 M", "1.0 MiB"),
        (7_000_000_000, "7.0 B", "6.5 GiB"),
    ],
)
def test_human_units(value: int, count: str, size: str) -> None:
    assert human_count(value) == count
    assert human_bytes(value) == size


def test_write_model_summary(tmp_path) -> None:
    summary = summarize_model(FrozenEmbedding())
    write_model_summary(summary, tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model_summary.json", "model_summary.txt"]
    data = json.loads((tmp_path / "model_summary.json").read_text())
    assert data == summary.to_dict()
    assert data["modules"][1] == {"name": "embed", "type": "Embedding", "trainable": 0, "frozen": 1600, "bytes": 6400}
    assert (data["total"], data["bytes"], data["frozen_modules"]) == (1671, 6704, ["embed"])
    assert (tmp_path / "model_summary.txt").read_text() == format_model_summary(summary)
    assert ModuleRow("a", "Linear", 0, 2, 8).frozen_entirely
