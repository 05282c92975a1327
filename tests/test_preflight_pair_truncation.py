"""PAIR_SECOND_SEGMENT_CUT: [CLS] first [SEP] second [SEP] joined and then cut to max_len, so
long first segments drop the second; the tokenizer's own 'only_first' truncation, single
sentences cut the same way and packed language-model chunks stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.pair_truncation import PairTruncationCheck

CLS, SEP, PAD, WIDTH = 1, 2, 0, 24


def encoded(layout: str, rows: int = 256) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(rows):
        first = torch.randint(10, 90, (int(torch.randint(10, 30, (1,), generator=g)),), generator=g).tolist()
        second = torch.randint(10, 90, (int(torch.randint(3, 7, (1,), generator=g)),), generator=g).tolist()
        if layout == "joined_then_cut":
            ids = ([CLS] + first + [SEP] + second + [SEP])[:WIDTH]
        elif layout == "only_first":
            keep = WIDTH - len(second) - 3
            ids = [CLS] + first[:keep] + [SEP] + second + [SEP]
        elif layout == "single_sentence":
            ids = ([CLS] + first + [SEP])[:WIDTH]
        else:  # packed LM chunks: documents joined by an end-of-text token, cut into rows
            ids = (first + [SEP] + second + [SEP] + first)[:WIDTH]
        out.append(ids + [PAD] * (WIDTH - len(ids)))
    return torch.tensor(out)


@pytest.mark.parametrize(("layout", "fires"), [("joined_then_cut", True), ("only_first", False),
                                               ("single_sentence", False), ("packed_chunks", False)])
def test_a_pair_cut_after_joining_fires(layout, fires):
    ids = encoded(layout)
    model = nn.Sequential(nn.Embedding(100, 8), nn.Flatten(), nn.Linear(8 * WIDTH, 2))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids, torch.randint(0, 2, (len(ids),))), batch_size=32,
                                      shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), PairTruncationCheck()])
    found = [i for i in report.check("data.pair_truncation").issues if i.code == "PAIR_SECOND_SEGMENT_CUT"]
    assert bool(found) == fires
    if found:
        assert "only_first" in found[0].fix and "separator (id 2)" in found[0].message


def test_a_token_that_ends_a_few_random_rows_by_chance_is_no_separator():
    """Random ids after a constant first token: some id ends a handful of rows and occurs twice
    in them by chance, as often as anywhere else."""
    from optimus_preflight.preflight.checks.pair_truncation import cut_pairs

    g = torch.Generator().manual_seed(4)
    ids = torch.randint(2, 32, (256, 12), generator=g)
    ids[:, 0] = CLS
    assert cut_pairs(ids) is None
