"""step.contrastive_targets: IN_BATCH_POSITIVES_MISMATCHED, an NT-Xent whose targets assume
the concatenated layout of the two views while the embeddings are interleaved; quiet on
the concatenated layout, on CLIP-style paired rows and on a classifier whose batch size
equals its number of classes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.contrastive_targets import ContrastiveTargetsCheck, sample_rows_and_columns
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck


def augment(x):
    return x * (torch.rand_like(x) > 0.3).float() + 0.3 * torch.randn_like(x)


def nt_xent(interleaved: bool, tau: float = 0.2):
    def loss_fn(model, batch):
        x = batch[0]
        b = len(x)
        z1, z2 = model(augment(x)), model(augment(x))
        z = torch.stack([z1, z2], dim=1).reshape(2 * b, -1) if interleaved else torch.cat([z1, z2])
        z = F.normalize(z, dim=1)
        similarity = (z @ z.T / tau).masked_fill(torch.eye(2 * b, dtype=torch.bool), -1e9)
        return F.cross_entropy(similarity, (torch.arange(2 * b) + b) % (2 * b))
    return loss_fn


def issues_of(model, data, loss_fn):
    torch.manual_seed(0)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(data, batch_size=32, shuffle=True, drop_last=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), ContrastiveTargetsCheck()])
    check = report.check("step.contrastive_targets")
    assert check.status.value in ("passed", "warning"), check.detail
    return check.issues


@pytest.mark.parametrize("interleaved", [True, False], ids=["stacked_views", "concatenated_views"])
def test_nt_xent_targets_for_another_layout_fire(interleaved):
    rows = TensorDataset(torch.randn(256, 16, generator=torch.Generator().manual_seed(0)))
    issues = issues_of(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), rows, nt_xent(interleaved))
    assert bool(issues) == interleaved
    if issues:
        assert "rows [0, 1]" in issues[0].message and "torch.cat([z1, z2])" in issues[0].fix


class TwoTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.image, self.text = nn.Linear(16, 8), nn.Linear(12, 8)

    def forward(self, images, texts):
        return F.normalize(self.image(images), dim=1) @ F.normalize(self.text(texts), dim=1).T / 0.07


def test_clip_style_paired_rows_are_quiet():
    g = torch.Generator().manual_seed(1)
    pairs = TensorDataset(torch.randn(256, 16, generator=g), torch.randn(256, 12, generator=g))

    def clip_loss(model, batch):
        logits = model(*batch)
        labels = torch.arange(len(logits))
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2

    assert issues_of(TwoTowers(), pairs, clip_loss) == []


class ImageCaptionTowers(nn.Module):
    """Captions as token ids (an EmbeddingBag), images as floats."""

    def __init__(self):
        super().__init__()
        self.image, self.words, self.text = nn.Linear(16, 8), nn.EmbeddingBag(50, 12), nn.Linear(12, 8)

    def forward(self, images, captions):
        return F.normalize(self.image(images), dim=1) @ F.normalize(self.text(self.words(captions)), dim=1).T / 0.07


@pytest.mark.parametrize("targets", ["class_ids", "positions"])
def test_class_labels_as_targets_of_in_batch_similarities(targets):
    g = torch.Generator().manual_seed(2)
    classes = torch.randint(0, 4, (256,), generator=g)
    captions = torch.randint(0, 50, (256, 6), generator=g)
    pairs = TensorDataset(torch.randn(256, 16, generator=g), captions, classes)

    def clip_loss(model, batch):
        logits = model(batch[0], batch[1])
        labels = batch[2] if targets == "class_ids" else torch.arange(len(logits))
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2

    torch.manual_seed(0)
    issues = issues_of(ImageCaptionTowers(), pairs, clip_loss)
    assert [i.code for i in issues] == (["IN_BATCH_POSITIVES_MISMATCHED"] if targets == "class_ids" else [])
    if issues:
        assert "class labels or ids of the batch" in issues[0].message and "torch.arange(B" in issues[0].fix


def test_a_classifier_whose_batch_size_equals_its_classes_is_quiet():
    g = torch.Generator().manual_seed(2)
    data = TensorDataset(torch.randn(256, 16, generator=g), torch.randint(0, 32, (256,), generator=g))
    assert issues_of(nn.Linear(16, 32), data, nn.CrossEntropyLoss()) == []


def test_a_samples_rows_change_whole_and_its_columns_change_elsewhere():
    before = torch.zeros(6, 6)
    after = before.clone()
    after[[1, 4]] = 1.0  # sample's two rows
    after[:, [1, 4]] = 1.0  # and its two columns in every other row
    assert sample_rows_and_columns(before, after) == ([1, 4], [1, 4])


def views_loss(views: str, tau: float = 0.1):
    """A paired-rows InfoNCE; ``views``: 'once' (one augmentation used for both views, the bug),
    'twice' (two independent draws) or 'same_input' (one input twice, SimCSE: dropout makes the views)."""
    def loss_fn(model, batch):
        x = batch[0]
        if views == "once":
            first = augment(x)
            second = first
        elif views == "twice":
            first, second = augment(x), augment(x)
        else:
            first = second = x
        a, b = F.normalize(model(first), dim=1), F.normalize(model(second), dim=1)
        return F.cross_entropy(a @ b.T / tau, torch.arange(len(x)))
    return loss_fn


@pytest.mark.parametrize("views, dropout, fires", [("once", 0.0, True), ("twice", 0.0, False),
                                                    ("same_input", 0.1, False), ("same_input", 0.0, True)])
def test_identical_views_of_each_sample_fire(views, dropout, fires):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 8))
    rows = TensorDataset(torch.randn(256, 16, generator=torch.Generator().manual_seed(0)))
    issues = issues_of(model, rows, views_loss(views))
    assert [issue.code for issue in issues] == (["IN_BATCH_VIEWS_IDENTICAL"] if fires else [])
    if fires:
        assert "is 10, the largest score" in issues[0].message and "augment(x), augment(x)" in issues[0].fix


def test_identical_positives_needs_every_positive_at_the_maximum():
    from optimus_preflight.preflight.checks.contrastive_targets import identical_positives

    z = F.normalize(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), dim=1)
    assert identical_positives(z @ z.T / 0.5, torch.arange(8)) == pytest.approx(2.0)
    other = F.normalize(z + 0.1 * torch.randn(8, 4, generator=torch.Generator().manual_seed(1)), dim=1)
    assert identical_positives(z @ other.T / 0.5, torch.arange(8)) is None
    both = torch.cat([z, z])
    masked = (both @ both.T / 0.5).masked_fill(torch.eye(16, dtype=torch.bool), -1e9)
    assert identical_positives(masked, (torch.arange(16) + 8) % 16) == pytest.approx(2.0)


def self_labelled_nt_xent(interleaved: bool, masked: bool, tau: float = 0.2):
    """NT-Xent over both views stacked; the bug: the diagonal left in and targets arange(2B)."""
    def loss_fn(model, batch):
        x = batch[0]
        b = len(x)
        z1, z2 = model(augment(x)), model(augment(x))
        z = F.normalize(torch.stack([z1, z2], 1).reshape(2 * b, -1) if interleaved else torch.cat([z1, z2]), dim=1)
        similarity = z @ z.T / tau
        if masked:
            partner = torch.arange(2 * b) ^ 1 if interleaved else (torch.arange(2 * b) + b) % (2 * b)
            return F.cross_entropy(similarity.masked_fill(torch.eye(2 * b, dtype=torch.bool), -1e9), partner)
        return F.cross_entropy(similarity, torch.arange(2 * b))
    return loss_fn


@pytest.mark.parametrize("interleaved", [False, True], ids=["concatenated", "interleaved"])
@pytest.mark.parametrize("masked", [False, True], ids=["diagonal_as_positive", "masked_and_partner"])
def test_a_positive_that_is_the_row_itself_fires(interleaved, masked):
    rows = TensorDataset(torch.randn(256, 16, generator=torch.Generator().manual_seed(0)))
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    issues = issues_of(model, rows, self_labelled_nt_xent(interleaved, masked))
    assert [issue.code for issue in issues] == ([] if masked else ["IN_BATCH_POSITIVE_IS_SELF"])
    if issues:
        assert "torch.arange(64), the diagonal" in issues[0].message
        expected = "torch.arange(64) ^ 1" if interleaved else "(torch.arange(64) + 32) % 64"
        assert expected in issues[0].fix and "fill_diagonal_" in issues[0].fix


def batch_hard_triplet(model, batch):
    x, labels = batch
    emb = model(x)
    d = torch.cdist(emb, emb)
    same = labels[:, None] == labels[None, :]
    hardest_positive = (d * (same & ~torch.eye(len(labels), dtype=torch.bool))).max(1).values
    hardest_negative = d.masked_fill(same, float("inf")).min(1).values
    return F.relu(hardest_positive - hardest_negative + 0.3).mean()


@pytest.mark.parametrize("pk_batches", [False, True])
def test_triplet_batches_drawn_from_many_classes_lack_positives(pk_batches):
    g = torch.Generator().manual_seed(3)
    labels = torch.arange(100).repeat_interleave(8)  # 100 classes x 8 samples
    data = TensorDataset(torch.randn(800, 16, generator=g) + labels[:, None] % 7, labels)
    if pk_batches:  # 8 classes x 4 samples per batch
        batches = [torch.cat([torch.arange(c * 8, c * 8 + 4) for c in range(start, start + 8)]).tolist()
                   for start in range(0, 96, 8)]
        loader = DataLoader(data, batch_sampler=batches)
    else:
        loader = DataLoader(data, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=batch_hard_triplet,
                           checks=[FirstBatchCheck(), ContrastiveTargetsCheck()])
    issues = [i for i in report.check("step.contrastive_targets").issues if i.code == "IN_BATCH_NO_POSITIVES"]
    assert bool(issues) == (not pk_batches)
    if issues:
        assert "share their label with no other sample" in issues[0].message and "P classes x K" in issues[0].fix


class QueryItemTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.query_tower = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
        self.item_table = nn.Embedding(500, 8)

    def forward(self, queries, items):
        return F.normalize(self.query_tower(queries), dim=1), F.normalize(self.item_table(items), dim=1)


def in_batch_softmax_masking_duplicates(model, batch):
    """Two-tower retrieval: row i's positive is column i (its own pair); the label equality
    only takes a repeated item out of the negatives."""
    queries, items = batch
    u, v = model(queries, items)
    logits = u @ v.T / 0.05
    duplicate = (items[:, None] == items[None, :]) & ~torch.eye(len(items), dtype=torch.bool)
    return F.cross_entropy(logits.masked_fill(duplicate, float("-inf")), torch.arange(len(items)))


def test_in_batch_negatives_with_a_duplicate_mask_have_their_positives_from_the_pairing():
    g = torch.Generator().manual_seed(5)
    items = torch.randint(0, 500, (640,), generator=g)  # nearly every item alone in its batch
    data = TensorDataset(torch.randn(640, 16, generator=g), items)
    model = QueryItemTowers()
    loader = DataLoader(data, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader,
                           loss_fn=in_batch_softmax_masking_duplicates,
                           checks=[FirstBatchCheck(), ContrastiveTargetsCheck()])
    result = report.check("step.contrastive_targets")
    assert result.status.value != "crashed" and "traced" in result.data["summary"]
    assert result.issues == []


def stacked_views_split(by_view: bool):
    def loss_fn(model, batch):
        (x,) = batch
        b = len(x)
        z = model(torch.cat([x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x)]))
        z1, z2 = z.view(b, 2, -1).unbind(1) if by_view else z.chunk(2)
        return F.cross_entropy(F.normalize(z1, dim=1) @ F.normalize(z2, dim=1).T / 0.2,
                               torch.arange(b, device=x.device))
    return loss_fn


@pytest.mark.parametrize("by_view", [True, False], ids=["view_B_2_D", "chunk_2"])
def test_stacked_views_split_back_with_view_never_meet(by_view):
    rows = TensorDataset(torch.randn(512, 16, generator=torch.Generator().manual_seed(0)))
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    issues = issues_of(model, rows, stacked_views_split(by_view))
    assert [issue.code for issue in issues] == (["IN_BATCH_POSITIVES_MISMATCHED"] if by_view else [])
    if issues:
        assert "never compared with each other" in issues[0].message and "z.chunk(2)" in issues[0].fix


def clip_loss(scale_of_cosines: float):
    def loss_fn(model, batch):
        z1 = F.normalize(model(augment(batch[0])), dim=1)
        z2 = F.normalize(model(augment(batch[0])), dim=1)
        return F.cross_entropy(z1 @ z2.T * scale_of_cosines, torch.arange(len(z1)))
    return loss_fn


@pytest.mark.parametrize("scale", [1 / 14.3, 0.2, 1 / 0.07, 1 / 0.5, 1.0],
                         ids=["tau_14", "tau_5", "logit_scale_14", "tau_half", "tau_1"])
def test_a_temperature_above_two_fires_and_usual_ones_stay_quiet(scale):
    rows = TensorDataset(torch.randn(256, 16, generator=torch.Generator().manual_seed(0)))
    issues = issues_of(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), rows, clip_loss(scale))
    fired = [i for i in issues if i.code == "CONTRASTIVE_TEMPERATURE_TOO_HIGH"]
    assert bool(fired) == (scale < 0.5), [i.code for i in issues]
    if fired:
        assert f"temperature of {1 / scale:.3g}" in fired[0].message and "/ 0.1" in fired[0].fix


def test_unnormalised_dot_products_are_not_read_as_a_temperature():
    def loss_fn(model, batch):
        z1, z2 = model(augment(batch[0])), model(augment(batch[0]))
        return F.cross_entropy(z1 @ z2.T * 0.05, torch.arange(len(z1)))
    rows = TensorDataset(torch.randn(256, 16, generator=torch.Generator().manual_seed(0)))
    issues = issues_of(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), rows, loss_fn)
    assert not [i for i in issues if i.code == "CONTRASTIVE_TEMPERATURE_TOO_HIGH"]


class CosineRecommender(nn.Module):
    """Next-item scores as cosines between a session vector and every item's embedding."""

    def __init__(self, scale: float):
        super().__init__()
        self.session, self.items, self.scale = nn.Linear(16, 8), nn.Parameter(torch.randn(300, 8)), scale

    def forward(self, x):
        return self.scale * F.normalize(self.session(x), dim=1) @ F.normalize(self.items, dim=1).T


@pytest.mark.parametrize("scale", [1.0, 20.0], ids=["plain_cosines", "temperature_0.05"])
def test_class_logits_that_are_plain_cosines_over_a_catalogue(scale):
    g = torch.Generator().manual_seed(5)
    rows = TensorDataset(torch.randn(256, 16, generator=g), torch.randint(0, 300, (256,), generator=g))
    torch.manual_seed(0)
    issues = issues_of(CosineRecommender(scale), rows, lambda m, b: F.cross_entropy(m(b[0]), b[1]))
    assert [i.code for i in issues] == (["CONTRASTIVE_TEMPERATURE_TOO_HIGH"] if scale == 1.0 else [])
    if issues:
        assert "300 classes" in issues[0].message and "2.4%" in issues[0].message and "/ 0.05" in issues[0].fix
