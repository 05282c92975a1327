"""data.val_loader: an empty validation loader is a warning; a healthy one is quiet."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from optimus_preflight.preflight.checks.val_loader import ValidationLoaderCheck
from optimus_preflight.preflight.framework import CheckStatus
from tests.preflight_support import assert_quiet, classification_data, codes, plain_context, run


class Nothing(IterableDataset):
    def __iter__(self):
        return iter(())


def _check(tmp_path, val_loader):
    ctx = plain_context(tmp_path)
    ctx.val_loader = val_loader
    return run(ctx, ValidationLoaderCheck)["data.val_loader"]


def test_a_split_smaller_than_one_batch_with_drop_last_warns(tmp_path):
    val = TensorDataset(torch.randn(5, 8), torch.randint(0, 4, (5,)))
    result = _check(tmp_path, DataLoader(val, batch_size=16, drop_last=True))
    assert result.status == CheckStatus.WARNING and codes(result) == {"DATA_VAL_EMPTY"}
    assert "drop_last=True" in result.issues[0].message


def test_an_empty_iterable_validation_set_warns(tmp_path):
    assert codes(_check(tmp_path, DataLoader(Nothing(), batch_size=4))) == {"DATA_VAL_EMPTY"}


def test_a_healthy_validation_loader_and_none_are_quiet(tmp_path):
    assert_quiet(_check(tmp_path, DataLoader(classification_data(20), batch_size=8, shuffle=False)))
    assert_quiet(_check(tmp_path, None))
