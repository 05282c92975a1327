"""step.pair_labels: PAIR_LABELS_INVERTED, a pair loss whose label convention is the
opposite of the data's (Hadsell's contrastive loss copied with y = 1 'dissimilar', a
CosineEmbeddingLoss fed -1 for matching pairs); quiet with the conventions agreeing and on
a ranking batch whose label says nothing about closeness."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.pair_labels import PairLabelsCheck, pair_fields


def product_pairs(n: int = 512, similar_label: float = 1.0, other_label: float = 0.0) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    prototypes = torch.randn(30, 24, generator=g)
    first = torch.randint(0, 30, (n,), generator=g)
    same = torch.rand(n, generator=g) < 0.5
    second = torch.where(same, first, (first + torch.randint(1, 30, (n,), generator=g)) % 30)
    a = prototypes[first] + 0.8 * torch.randn(n, 24, generator=g)
    b = prototypes[second] + 0.8 * torch.randn(n, 24, generator=g)
    return TensorDataset(a, b, torch.where(same, similar_label, other_label))


def hadsell(y_one_means_similar: bool, margin: float = 2.0):
    def loss_fn(model, batch):
        a, b, y = batch
        d = F.pairwise_distance(model(a), model(b))
        pull, push = (y, 1 - y) if y_one_means_similar else (1 - y, y)
        return (pull * d.pow(2) + push * (margin - d).clamp(min=0).pow(2)).mean()
    return loss_fn


def cosine_embedding(model, batch):
    a, b, y = batch
    return nn.CosineEmbeddingLoss(margin=0.2)(model(a), model(b), y)


def pair_issues(data: TensorDataset, loss_fn):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 8))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=64, shuffle=True),
                           loss_fn=loss_fn, checks=[FirstBatchCheck(), PairLabelsCheck()])
    check = report.check("step.pair_labels")
    assert check.status.value in ("passed", "warning"), check.detail
    return check.issues


@pytest.mark.parametrize("y_one_means_similar, fires", [(False, True), (True, False)],
                         ids=["tutorial_convention", "data_convention"])
def test_a_contrastive_loss_with_the_other_convention_fires(y_one_means_similar, fires):
    issues = pair_issues(product_pairs(), hadsell(y_one_means_similar))
    assert bool(issues) == fires
    if fires:
        assert "pairs labelled 1 are the similar ones" in issues[0].message
        assert "label 1 marks the pairs it pulls together" in issues[0].fix


@pytest.mark.parametrize("similar_label, fires", [(-1.0, True), (1.0, False)], ids=["matching_pairs_minus_one", "plus_one"])
def test_cosine_embedding_loss_labels(similar_label, fires):
    issues = pair_issues(product_pairs(similar_label=similar_label, other_label=-similar_label), cosine_embedding)
    assert bool(issues) == fires


def test_a_ranking_batch_whose_label_says_nothing_about_closeness_is_quiet():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(512, 24, generator=g), torch.randn(512, 24, generator=g)
    better = (a[:, 0] > b[:, 0]).float() * 2 - 1
    scorer = nn.Linear(24, 1)

    def ranking(model, batch):
        x1, x2, y = batch
        return F.margin_ranking_loss(model(x1).squeeze(1), model(x2).squeeze(1), y, margin=0.5)

    report = run_preflight(scorer, torch.optim.SGD(scorer.parameters(), 0.1),
                           DataLoader(TensorDataset(a, b, better), batch_size=64, shuffle=True), loss_fn=ranking,
                           checks=[FirstBatchCheck(), PairLabelsCheck()])
    assert report.check("step.pair_labels").issues == []


def test_only_labelled_pairs_of_one_shape_are_judged():
    x, y = torch.randn(8, 4), torch.tensor([0, 1] * 4)
    assert pair_fields((x, x.clone(), y)) == (0, 1, 2)
    assert pair_fields((x, torch.randn(8, 5), y)) is None  # two inputs of other shapes: no pair
    assert pair_fields((x, x, torch.zeros(8))) is None  # one label value
    assert pair_fields((x, y)) is None


def _triplets(n: int = 512) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    prototypes = torch.randn(10, 16, generator=g)
    own = torch.randint(0, 10, (n,), generator=g)
    other = (own + torch.randint(1, 10, (n,), generator=g)) % 10
    def noisy(ids):
        return prototypes[ids] + 0.5 * torch.randn(n, 16, generator=g)
    return TensorDataset(noisy(own), noisy(own), noisy(other))


@pytest.mark.parametrize("order", ["swapped", "right"])
def test_a_triplet_loss_given_the_negative_as_the_positive(order):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))

    def triplet(model, batch):
        anchor, positive, negative = batch
        if order == "swapped":
            return F.triplet_margin_loss(model(anchor), model(negative), model(positive))
        return F.triplet_margin_loss(model(anchor), model(positive), model(negative))

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(_triplets(), batch_size=64, shuffle=True), loss_fn=triplet,
                           checks=[FirstBatchCheck(), PairLabelsCheck()])
    result = report.check("step.pair_labels")
    found = [i for i in result.issues if i.code == "TRIPLET_ROLES_SWAPPED"]
    assert bool(found) == (order == "swapped"), result.data
    assert result.data["b_closer_share"] > 0.75
    if found:
        assert "batch[1]" in found[0].message and "f(positive), f(negative)" in found[0].fix
