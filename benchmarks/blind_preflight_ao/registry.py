"""Set ao's case registry: set a's Case / CaseTable and data helpers, its own case table, the text helpers its cases
share, and the one-line fixes ``verify.py`` trains next to each broken case (``FIXES``: no preflight involved)."""

from __future__ import annotations

import math

import torch

from benchmarks.blind_preflight.fixes import FixTable, accuracy, val_acc  # noqa: F401
from benchmarks.blind_preflight.registry import (  # noqa: F401
    Case,
    CaseTable,
    gen,
    loader,
    mean_over,
    model_device,
    seed,
    teacher_classes,
    teacher_regression,
    token_sequences,
    twin,
)

TABLE = CaseTable.by_family("benchmarks.blind_preflight_ao")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix

PAD, UNK, CLS, SEP = 0, 1, 2, 3


def fixed_of(builder):
    return lambda: builder(fixed=True)


def rmse_of(fwd):
    """Validation RMSE with fwd(model, batch) -> (predictions, targets) of any matching numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


def acc_of(fwd, batches=None):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels); labels -100 are skipped.
    ``batches``: a function returning the batches to score on (default: the case's own val_loader)."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, batches() if batches else kw["val_loader"], fn)
    return metric


def keyword_texts(n: int, length: int, vocab: int, n_classes: int, s: int, lengths: tuple[int, int] | None = None):
    """Token-id "documents": filler ids >= 4 + n_classes, one keyword id (4 + label) at a random position; ids 0-3 are
    PAD, UNK, CLS, SEP. With ``lengths`` each row has a random true length (right-padded with PAD)."""
    g = gen(s)
    x = torch.randint(4 + n_classes, vocab, (n, length), generator=g)
    y = torch.randint(0, n_classes, (n,), generator=g)
    if lengths:
        lens = torch.randint(lengths[0], lengths[1] + 1, (n,), generator=g)
    else:
        lens = torch.full((n,), length)
    pos = (torch.rand(n, generator=g) * lens).long()
    x[torch.arange(n), pos] = 4 + y
    x[torch.arange(length)[None, :] >= lens[:, None]] = PAD
    return x, y, lens


def order_texts(n: int, length: int, vocab: int, s: int):
    """Binary word-order task: the bigram "A B" (label 1) or "B A" (label 0) occurs once (A=4, B=5), like
    "not good" against "good not"."""
    g = gen(s)
    x = torch.randint(6, vocab, (n, length), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    for i in range(n):
        p = int(torch.randint(0, length - 1, (1,), generator=g))
        a, b = (p, p + 1) if y[i] == 1 else (p + 1, p)
        x[i, a], x[i, b] = 4, 5
    return x, y


def chain_sequences(n: int, length: int, vocab: int, s: int, low: int = 4) -> torch.Tensor:
    """Token streams from a fixed successor table over ids >= low (each token determines the next one), from a
    random first token: a masked or next token is predictable from its left neighbour."""
    succ = low + torch.randperm(vocab - low, generator=gen(999))
    g = gen(s)
    x = torch.empty(n, length, dtype=torch.long)
    x[:, 0] = torch.randint(low, vocab, (n,), generator=g)
    for t in range(1, length):
        x[:, t] = succ[x[:, t - 1] - low]
    return x
