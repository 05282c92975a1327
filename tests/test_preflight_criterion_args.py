"""Criterion arguments torch accepts silently (``analyses/criterion_args.py``), reported by
``step.loss_function``: CTC targets that contain the blank (CTC_BLANK_IN_TARGETS), a
Poisson loss reading a non-negative rate as a log-rate (POISSON_LOG_INPUT), and a
hand-written NLL that picks scores with ``log_probs[:, labels]`` (LOSS_INDEXED_BY_BATCH).
Each is written the way a user writes the bug, next to its correct twin."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.criterion_args import blank_only_ends_rows, ctc_blank_in_targets
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck


def _issues(model, loader, loss_fn, code):
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    step = report.check("step.first_step")
    assert not [i for i in step.issues if i.code == "STEP_ERROR"], step.issues
    return [i for i in report.check("step.loss_function").issues if i.code == code]


# ------------------------------------------------------------------ CTC_BLANK_IN_TARGETS

FRAMES, FEATURES, LABELS = 20, 12, 8  # LABELS characters; the head has one more output for the blank
CLASSES = LABELS + 1


class Recogniser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(FEATURES, 32, batch_first=True)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x):
        return self.head(self.rnn(x)[0])  # (N, T, C)


def _speech(first_label: int, pad: int = 0):
    """Padded (N, S) label rows using labels first_label .. first_label + LABELS - 1."""
    torch.manual_seed(0)
    n, longest = 64, 6
    lengths = torch.randint(2, longest + 1, (n,))
    labels = torch.randint(first_label, first_label + LABELS, (n, longest))
    labels[torch.arange(longest)[None, :] >= lengths[:, None]] = pad  # padding beyond each row's length
    return TensorDataset(torch.randn(n, FRAMES, FEATURES), labels, lengths)


def _ctc_loss_fn(ctc):
    def loss_fn(model, batch):
        x, labels, label_lengths = batch
        log_probs = model(x).log_softmax(-1).transpose(0, 1)  # (T, N, C) for CTC
        frames = torch.full((x.size(0),), log_probs.size(0), dtype=torch.long)
        return ctc(log_probs, labels, frames, label_lengths)
    return loss_fn


def test_ctc_left_at_blank_0_while_the_vocabulary_reserves_the_last_class_is_an_error():
    # labels 0..7 from a vocabulary whose blank is its last index (8); CTCLoss() keeps blank=0
    torch.manual_seed(0)
    issues = _issues(Recogniser(), DataLoader(_speech(first_label=0), batch_size=16),
                     _ctc_loss_fn(nn.CTCLoss()), "CTC_BLANK_IN_TARGETS")
    assert len(issues) == 1 and issues[0].severity.value == "error"
    assert "blank=0" in issues[0].message and "target symbols" in issues[0].message
    assert f"nn.CTCLoss(blank={CLASSES - 1})" in issues[0].fix


@pytest.mark.parametrize("setup", ["blank_last", "labels_from_1_padded_with_0"])
def test_ctc_targets_without_the_blank_stay_quiet(setup):
    torch.manual_seed(0)
    if setup == "blank_last":
        dataset, ctc = _speech(first_label=0, pad=0), nn.CTCLoss(blank=CLASSES - 1)
    else:  # the blank is 0, labels 1..8, rows padded with 0 past their target_lengths
        dataset, ctc = _speech(first_label=1, pad=0), nn.CTCLoss()
    issues = _issues(Recogniser(), DataLoader(dataset, batch_size=16), _ctc_loss_fn(ctc), "CTC_BLANK_IN_TARGETS")
    assert issues == []


def test_ctc_blank_counts_only_symbols_inside_the_target_lengths():
    log_probs = torch.randn(10, 2, 5).log_softmax(-1)
    padded = torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0]])  # 0 only as padding
    assert ctc_blank_in_targets((log_probs, padded, [10, 10], [2, 1]), {}) is None
    found = ctc_blank_in_targets((log_probs, torch.tensor([1, 0, 3]), [10, 10], [2, 1]), {"blank": 0})
    assert found is not None and (found.count, found.total, found.classes) == (1, 3, 5)


@pytest.mark.parametrize("lengths", ["padded_width", "true_lengths"])
def test_ctc_target_lengths_that_count_the_padding_are_named_as_such(lengths):
    """Labels 1..8 padded with 0, the blank: target_lengths = the padded width for every row makes
    CTC train on the padding; each row's true length is quiet."""
    torch.manual_seed(0)

    def loss_fn(model, batch):
        x, labels, label_lengths = batch
        log_probs = model(x).log_softmax(-1).transpose(0, 1)
        frames = torch.full((x.size(0),), log_probs.size(0), dtype=torch.long)
        if lengths == "padded_width":
            label_lengths = torch.full((x.size(0),), labels.shape[1], dtype=torch.long)
        return F.ctc_loss(log_probs, labels, frames, label_lengths)

    issues = _issues(Recogniser(), DataLoader(_speech(first_label=1), batch_size=16), loss_fn, "CTC_BLANK_IN_TARGETS")
    assert len(issues) == (lengths == "padded_width")
    if issues:
        assert "padding is counted as labels" in issues[0].message and "true length" in issues[0].fix
    padded_labels = torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0], [2, 2, 1, 3]])
    assert blank_only_ends_rows(list(padded_labels), 0)
    assert not blank_only_ends_rows([torch.tensor([1, 0, 2, 0]), torch.tensor([3, 0, 0, 0])], 0)


# ------------------------------------------------------------------ CTC_LENGTHS_TOO_SHORT

def _ctc_lengths_loss_fn(divide_by: int, zero_infinity: bool = True):
    """input_lengths = the model's frames // divide_by: 1 is its real length; 4 is a 4x
    subsampling recipe's formula on a model that keeps every frame."""
    def loss_fn(model, batch):
        x, labels, label_lengths = batch
        log_probs = model(x).log_softmax(-1).transpose(0, 1)
        frames = torch.full((x.size(0),), log_probs.size(0) // divide_by, dtype=torch.long)
        return F.ctc_loss(log_probs, labels, frames, label_lengths, blank=CLASSES - 1, zero_infinity=zero_infinity)
    return loss_fn


@pytest.mark.parametrize(("divide_by", "fires"), [(4, True), (1, False)], ids=["lengths_of_another_factor", "real"])
def test_ctc_input_lengths_shorter_than_the_targets_need_are_named(divide_by, fires):
    torch.manual_seed(0)
    issues = _issues(Recogniser(), DataLoader(_speech(first_label=0), batch_size=16),
                     _ctc_lengths_loss_fn(divide_by), "CTC_LENGTHS_TOO_SHORT")
    assert bool(issues) == fires
    if fires:
        assert "zero_infinity=True turns their infinite losses into 0" in issues[0].message
        assert "longest input_length is 5 of the 20 frames" in issues[0].message


def test_ctc_feasibility_counts_a_blank_between_repeated_symbols():
    from optimus_preflight.preflight.analyses.criterion_args import ctc_lengths_infeasible

    log_probs = torch.randn(6, 2, 5).log_softmax(-1)
    repeated = torch.tensor([[1, 1, 2], [3, 3, 3]])  # need 4 and 5 frames
    assert ctc_lengths_infeasible((log_probs, repeated, [4, 5], [3, 3]), {}) is None
    found = ctc_lengths_infeasible((log_probs, repeated, [3, 4], [3, 3]), {"zero_infinity": True})
    assert found is not None and (found.infeasible, found.total, found.zero_infinity) == (2, 2, True)


# ------------------------------------------------------------------ CTC_NOT_LOG_PROBS

def _ctc_scores_loss_fn(ctc, normalise):
    def loss_fn(model, batch):
        x, labels, label_lengths = batch
        scores = normalise(model(x)).transpose(0, 1)
        frames = torch.full((x.size(0),), scores.size(0), dtype=torch.long)
        return ctc(scores, labels, frames, label_lengths)
    return loss_fn


@pytest.mark.parametrize("normalise,kind", [(lambda logits: logits, "raw logits"),
                                            (lambda logits: logits.softmax(-1), "probabilities")])
def test_ctc_on_scores_that_are_not_log_probabilities_is_an_error(normalise, kind):
    torch.manual_seed(0)
    issues = _issues(Recogniser(), DataLoader(_speech(first_label=1), batch_size=16),
                     _ctc_scores_loss_fn(nn.CTCLoss(), normalise), "CTC_NOT_LOG_PROBS")
    assert len(issues) == 1 and issues[0].severity.value == "error"
    assert f"ctc_loss receives {kind}" in issues[0].message and "log_softmax(dim=-1)" in issues[0].fix


@pytest.mark.parametrize("normalise", [lambda logits: logits.log_softmax(-1),
                                       lambda logits: F.log_softmax(logits.double(), dim=2).float()])
def test_ctc_on_log_probabilities_stays_quiet(normalise):
    torch.manual_seed(0)
    issues = _issues(Recogniser(), DataLoader(_speech(first_label=1), batch_size=16),
                     _ctc_scores_loss_fn(nn.CTCLoss(), normalise), "CTC_NOT_LOG_PROBS")
    assert issues == []


# ------------------------------------------------------------------ POISSON_LOG_INPUT

def _counts():
    torch.manual_seed(0)
    x = torch.randn(256, 6)
    return DataLoader(TensorDataset(x, torch.poisson(torch.full((256, 1), 0.7))), batch_size=32)


RATE_HEADS = {
    "softplus_default_log_input": (lambda: nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1), nn.Softplus()),
                                   nn.PoissonNLLLoss, True),
    "relu_default_log_input": (lambda: nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1), nn.ReLU()),
                               nn.PoissonNLLLoss, True),
    "linear_log_rate": (lambda: nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1)), nn.PoissonNLLLoss, False),
    "softplus_rate_log_input_false": (lambda: nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1), nn.Softplus()),
                                      lambda: nn.PoissonNLLLoss(log_input=False), False),
}


@pytest.mark.parametrize("head", sorted(RATE_HEADS))
def test_poisson_log_input_on_a_non_negative_rate_is_a_warning(head):
    build, criterion, fires = RATE_HEADS[head]
    torch.manual_seed(0)
    issues = _issues(build(), _counts(), criterion(), "POISSON_LOG_INPUT")
    assert bool(issues) == fires
    if fires:
        assert issues[0].severity.value == "warning" and "log_input=False" in issues[0].fix
        assert "never below 1" in issues[0].message and "targets are below 1" in issues[0].message


def test_functional_poisson_on_exp_output_is_reported():
    def loss_fn(model, batch):
        x, y = batch
        rate = torch.exp(model(x))
        return F.poisson_nll_loss(rate, y)  # log_input=True by default

    torch.manual_seed(0)
    issues = _issues(nn.Linear(6, 1), _counts(), loss_fn, "POISSON_LOG_INPUT")
    assert len(issues) == 1 and "exp" in issues[0].message


# ------------------------------------------------------------------ LOSS_INDEXED_BY_BATCH

def _classes():
    torch.manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(256, 8), torch.randint(0, 5, (256,))), batch_size=32)


def _classifier():
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 5))


def test_nll_written_with_log_probs_colon_labels_is_an_error():
    def loss_fn(model, batch):
        x, labels = batch
        log_probs = F.log_softmax(model(x), dim=1)
        return -log_probs[:, labels].mean()  # (B, B): every sample against every label

    torch.manual_seed(0)
    issues = _issues(_classifier(), _classes(), loss_fn, "LOSS_INDEXED_BY_BATCH")
    assert len(issues) == 1 and issues[0].severity.value == "error"
    assert "(32, 5)" in issues[0].message and "(32, 32)" in issues[0].message
    assert "torch.arange" in issues[0].fix and "gather(1, labels[:, None])" in issues[0].fix


def test_likelihood_through_probabilities_and_a_sum_is_an_error_too():
    def loss_fn(model, batch):
        x, y = batch
        probs = model(x).softmax(dim=-1)
        return -torch.log(probs[:, y] + 1e-8).sum() / len(y)

    torch.manual_seed(0)
    assert len(_issues(_classifier(), _classes(), loss_fn, "LOSS_INDEXED_BY_BATCH")) == 1


PICKS = {
    "arange": lambda log_probs, labels: -log_probs[torch.arange(len(labels)), labels].mean(),
    "gather": lambda log_probs, labels: -log_probs.gather(1, labels[:, None]).squeeze(1).mean(),
    "diagonal_of_the_pick": lambda log_probs, labels: -log_probs[:, labels].diag().mean(),
}


@pytest.mark.parametrize("pick", sorted(PICKS))
def test_one_score_per_sample_stays_quiet(pick):
    def loss_fn(model, batch):
        x, labels = batch
        return PICKS[pick](F.log_softmax(model(x), dim=1), labels)

    torch.manual_seed(0)
    assert _issues(_classifier(), _classes(), loss_fn, "LOSS_INDEXED_BY_BATCH") == []


def test_a_similarity_matrix_indexed_by_a_permutation_stays_quiet():
    def loss_fn(model, batch):
        x, _ = batch
        z = F.normalize(model(x), dim=1)
        view = F.normalize(model(x + 0.01 * torch.randn_like(x)), dim=1)
        perm = torch.randperm(len(x))
        sim = (z @ view.T)[:, perm]  # (B, B) columns reordered, not class scores
        return F.cross_entropy(sim / 0.1, torch.argsort(perm))

    torch.manual_seed(0)
    assert _issues(_classifier(), _classes(), loss_fn, "LOSS_INDEXED_BY_BATCH") == []


# ---------------------------------------------------------------- MULTILABEL_MARGIN_MULTI_HOT
def _tags(as_indices: bool):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(256, 12, generator=g)
    multi_hot = (x[:, :6] > 0.8).long()
    if not as_indices:
        return x, multi_hot
    indices = torch.full((256, 6), -1)
    for row in range(256):
        tags = multi_hot[row].nonzero().flatten()
        indices[row, :len(tags)] = tags
    return x, indices


@pytest.mark.parametrize("as_indices", [False, True], ids=["multi_hot", "index_lists"])
def test_multi_hot_targets_into_multilabel_margin_loss_are_an_error(as_indices):
    torch.manual_seed(0)
    x, target = _tags(as_indices)
    found = _issues(nn.Linear(12, 6), DataLoader(TensorDataset(x, target), batch_size=32, shuffle=True),
                    nn.MultiLabelMarginLoss(), "MULTILABEL_MARGIN_MULTI_HOT")
    assert bool(found) == (not as_indices)
    if found:
        assert "class INDICES padded with -1" in found[0].message and "BCEWithLogitsLoss" in found[0].fix
