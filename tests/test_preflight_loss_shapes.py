"""What reaches the criterion, end to end through ``run_preflight``: shapes that
broadcast, a softmax over the wrong dim, targets of one class, multi-hot rows into
cross_entropy, ignored targets, and sequence batches whose batch axis a module misreads.
Each broken setup is written the way users write it, beside the healthy one it is
mistaken for."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.batch_layout import BatchLayoutCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import (
    FirstStepCheck,
    InitialLossCheck,
    LossFunctionCheck,
    TargetsCheck,
)
from optimus_preflight.preflight.framework import Severity

NEW_CODES = {"LOSS_BROADCAST", "LOSS_NORM_DIM", "TARGET_ONE_CLASS", "TARGET_MULTI_HOT", "TARGET_ALL_IGNORED",
             "TARGET_MOSTLY_IGNORED", "BATCH_TIME_MAJOR", "BATCH_NOT_TIME_MAJOR"}
FEATURES, CLASSES, VOCAB, TAGS = 8, 5, 50, 5


def preflight(model, loader, loss_fn):
    checks = [FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck(), TargetsCheck(), InitialLossCheck(),
              BatchLayoutCheck()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own broadcasting warning: the report must say it
        return run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=loss_fn,
                             checks=checks)


def issues(report) -> dict[str, object]:
    return {issue.code: issue for _, issue in report.issues() if issue.severity != Severity.INFO}


def mlp(outputs: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, outputs))


def features(samples: int = 256) -> torch.Tensor:
    return torch.randn(samples, FEATURES, generator=torch.Generator().manual_seed(0))


def loader(*tensors: torch.Tensor, batch_size: int = 32, shuffle: bool = True) -> DataLoader:
    return DataLoader(TensorDataset(*tensors), batch_size=batch_size, shuffle=shuffle)


def hand_written_mse(model, batch):
    inputs, y = batch
    return ((model(inputs) - y) ** 2).mean()  # (B, 1) - (B,): (B, B)


def hand_written_bce(model, batch):
    inputs, y = batch
    p = torch.sigmoid(model(inputs)).clamp(1e-6, 1 - 1e-6)
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()


@pytest.mark.parametrize("loss", [hand_written_mse, hand_written_bce])
def test_a_hand_written_loss_that_broadcasts_a_prediction_column(loss):
    x = features()
    found = issues(preflight(mlp(1), loader(x, (x.sum(1) > 0).float()), loss))["LOSS_BROADCAST"]
    assert "(32, 1)" in found.message and "(32,)" in found.message and "(32, 32)" in found.message
    assert "prediction.squeeze(-1)" in found.fix
    # the user's own line that broadcast, as a traceback names it
    assert f"in {loss.__name__}: " in found.message and "test_preflight_loss_shapes.py" in found.message


def test_a_criterion_module_called_by_the_default_loss_names_no_line_of_the_caller():
    """nn.MSELoss passed as loss_fn: the preflight's own loss calls it, the test's line is not the call."""
    x = features()
    found = issues(preflight(mlp(1), loader(x, x.sum(1)), nn.MSELoss()))["LOSS_BROADCAST"]
    assert "mse_loss (nn.MSELoss)" in found.message and "The line" not in found.message


def siamese_contrastive(model, batch):
    inputs, same = batch
    d = F.pairwise_distance(model(inputs), model(inputs.flip(0)), keepdim=True)  # (B, 1)
    return (same * d ** 2 + (1 - same) * F.relu(1.0 - d) ** 2).mean()  # against (B,) pair labels


def test_a_distance_kept_as_a_column_names_keepdim():
    x = features()
    found = issues(preflight(mlp(8), loader(x, (x.sum(1) > 0).float()), siamese_contrastive))["LOSS_BROADCAST"]
    assert "keepdim=True" in found.message and "drop keepdim=True" in found.fix
    assert "keepdim" not in issues(preflight(mlp(1), loader(x, x.sum(1)), hand_written_mse))["LOSS_BROADCAST"].message


def box_l1(model, batch):
    inputs, boxes = batch  # boxes: (B, 1, 4), one box per image in the detection format
    return (model(inputs) - boxes).abs().mean()  # (B, 4) - (B, 1, 4): (B, B, 4)


def test_a_hand_written_loss_whose_batch_axes_meet_on_two_dims_is_a_broadcast():
    x = features()
    found = issues(preflight(mlp(4), loader(x, x[:, None, :4].clone()), box_l1))["LOSS_BROADCAST"]
    assert "(32, 4)" in found.message and "(32, 1, 4)" in found.message and "(32, 32, 4)" in found.message
    assert "view_as" in found.fix


def pairwise_ranking(model, batch):
    inputs, y = batch
    scores = model(inputs)  # (B, 1)
    margins = scores - scores.T  # every pair of predictions: deliberate
    wanted = (y[:, None] > y[None, :]).float()
    return (F.softplus(-margins) * wanted).sum() / wanted.sum().clamp_min(1) + ((scores.squeeze(-1) - y) ** 2).mean()


def test_hand_written_losses_of_one_shape_and_pairwise_terms_are_quiet():
    x = features()
    y = x.sum(1)
    fixed = lambda model, batch: ((model(batch[0]).squeeze(-1) - batch[1]) ** 2).mean()  # noqa: E731
    assert not issues(preflight(mlp(1), loader(x, y), fixed))
    assert not issues(preflight(mlp(1), loader(x, y), pairwise_ranking))


def tag_logits() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, TAGS))  # (B, T) -> (B, T, C) logits


def ner_batches(pad_with: int, ignore_index: int):
    """Tag sequences where tag 0 ("O") is most tokens, right-padded with ``pad_with``."""
    g = torch.Generator().manual_seed(0)
    tags = torch.where(torch.rand(128, 12, generator=g) < 0.8, 0, torch.randint(1, TAGS, (128, 12), generator=g))
    lengths = torch.randint(6, 13, (128,), generator=g)
    tags[torch.arange(12)[None, :] >= lengths[:, None]] = pad_with
    tokens = torch.randint(1, VOCAB, (128, 12), generator=g)

    def loss(model, batch):
        return F.cross_entropy(model(batch[0]).transpose(1, 2), batch[1], ignore_index=ignore_index)

    return loader(tokens, tags), loss


def test_an_ignore_index_that_is_also_the_o_tag_warns():
    batches, loss = ner_batches(pad_with=0, ignore_index=0)  # pad 0 and ignore 0, but 0 is also "O"
    found = issues(preflight(tag_logits(), batches, loss))["TARGET_IGNORED_CLASS"]
    assert "ignore_index=0 is also class 0" in found.message and "-100" in found.fix


def test_padding_with_its_own_ignored_id_is_quiet():
    batches, loss = ner_batches(pad_with=-100, ignore_index=-100)
    assert not issues(preflight(tag_logits(), batches, loss))


def one_entity_batches(ignore_index: int, pad_with: int):
    """One two-token entity per sentence at a random place, "O" (0) elsewhere, right-padded:
    no ignored tag lies between two kept ones, the O tags sit at both ends of each row."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, 13, (128,), generator=g)
    starts = (torch.rand(128, generator=g) * (lengths - 2)).long()
    tags = torch.zeros(128, 12, dtype=torch.long)
    rows = torch.arange(128)
    tags[rows, starts] = 1
    tags[rows, starts + 1] = 2
    tags[torch.arange(12)[None, :] >= lengths[:, None]] = pad_with
    tokens = torch.randint(1, VOCAB, (128, 12), generator=g)

    def loss(model, batch):
        return F.cross_entropy(model(batch[0]).transpose(1, 2), batch[1], ignore_index=ignore_index)

    return loader(tokens, tags), loss


def test_an_o_tag_ignored_around_one_entity_per_sentence_warns():
    batches, loss = one_entity_batches(ignore_index=0, pad_with=0)
    assert "ignore_index=0 is also class 0" in issues(preflight(tag_logits(), batches, loss))["TARGET_IGNORED_CLASS"].message
    batches, loss = one_entity_batches(ignore_index=-100, pad_with=-100)
    assert not issues(preflight(tag_logits(), batches, loss))


def test_a_prompt_masked_with_the_pad_id_of_a_vocabulary_is_quiet():
    # An LM fine-tune: labels are the tokens, the prompt and the right padding both set to the
    # pad id 0, which CrossEntropyLoss(ignore_index=0) skips; the vocabulary is 2,000 tokens.
    vocab = 2000
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(1, vocab, (64, 16), generator=g)
    labels = tokens.clone()
    labels[:, :5] = 0  # the prompt
    labels[torch.arange(16)[None, :] >= torch.randint(9, 17, (64,), generator=g)[:, None]] = 0  # padding
    torch.manual_seed(0)
    lm = nn.Sequential(nn.Embedding(vocab, 16), nn.Linear(16, vocab))
    loss = lambda model, batch: F.cross_entropy(model(batch[0]).transpose(1, 2), batch[1], ignore_index=0)  # noqa: E731
    assert "TARGET_IGNORED_CLASS" not in issues(preflight(lm, loader(tokens, labels), loss))


@pytest.mark.parametrize("ignore_index, background, fires", [(0, 0, True), (255, 0, False), (0, 255, False)],
                         ids=["majority_class_ignored", "void_255_ignored", "void_0_at_the_borders"])
def test_an_in_range_ignore_index_covering_most_of_a_label_map(ignore_index, background, fires):
    # leaf scans: background (most pixels) and two kinds of spots; "void_0_at_the_borders" keeps
    # 0 as a real void label on a thin border, the way some datasets do
    g = torch.Generator().manual_seed(3)
    masks = torch.full((96, 16, 16), background, dtype=torch.long)
    masks[torch.rand(96, 16, 16, generator=g) < 0.1] = 1
    masks[torch.rand(96, 16, 16, generator=g) < 0.05] = 2
    if background == 255:
        masks[masks == 255] = 1
        masks[:, :, 0] = 0
    images = torch.randn(96, 3, 16, 16, generator=g)
    torch.manual_seed(0)
    segmenter = nn.Conv2d(3, 3, 1)
    loss = lambda model, batch: F.cross_entropy(model(batch[0]), batch[1], ignore_index=ignore_index)  # noqa: E731
    found = issues(preflight(segmenter, loader(images, masks), loss))
    assert ("TARGET_IGNORED_CLASS" in found) == fires
    if fires:
        assert "ignore_index=0 is also class 0" in found["TARGET_IGNORED_CLASS"].message


# ------------------------------------------------------------ regression target scale
def price_mse(model, batch):
    inputs, y = batch
    return F.mse_loss(model(inputs).squeeze(-1), y)


def test_raw_price_targets_far_above_the_predictions_warn():
    x = features()
    prices = 250_000 + 50_000 * x[:, 0]  # dollars, as read from the CSV
    found = issues(preflight(mlp(1), loader(x, prices), price_mse))["TARGET_SCALE"]
    assert found.severity == Severity.WARNING and "Standardise" in found.fix
    assert "targets in [" in found.message


def test_standardised_targets_or_a_head_at_their_scale_are_quiet():
    x = features()
    prices = 250_000 + 50_000 * x[:, 0]
    standardised = (prices - prices.mean()) / prices.std()
    assert not issues(preflight(mlp(1), loader(x, standardised), price_mse))

    head = mlp(1)
    with torch.no_grad():
        head[-1].bias.fill_(float(prices.mean()))  # the last layer starts at the targets' scale
    assert "TARGET_SCALE" not in issues(preflight(head, loader(x, prices), price_mse))


# ------------------------------------------------------------ broadcasting at the loss
@pytest.mark.parametrize("criterion", [nn.MSELoss(), nn.L1Loss(), nn.SmoothL1Loss(), nn.HuberLoss()])
def test_a_column_prediction_against_a_flat_target_broadcasts_to_batch_by_batch(criterion):
    x = features()
    report = preflight(mlp(1), loader(x, x.sum(1)), criterion)  # target (B,), prediction (B, 1)
    found = issues(report)["LOSS_BROADCAST"]
    assert found.severity == Severity.ERROR
    assert "(32, 1)" in found.message and "(32,)" in found.message and "(32, 32)" in found.message
    assert "squeeze(-1)" in found.fix


def test_a_one_channel_depth_map_against_channel_less_targets_is_named_and_squeezed():
    g = torch.Generator().manual_seed(0)
    images, depth = torch.randn(64, 3, 8, 8, generator=g), 1 + 4 * torch.rand(64, 8, 8, generator=g)
    found = issues(preflight(nn.Conv2d(3, 1, 3, padding=1), loader(images, depth), nn.MSELoss()))["LOSS_BROADCAST"]
    assert "(N, 1, H, W) against (N, H, W), to (N, N, H, W)" in found.message
    assert "prediction.squeeze(1)" in found.fix


class GraphRegressor(nn.Module):
    """Node features of a batch of graphs, pooled per graph by a batch assignment vector; without
    it (batch=None), as PyG's global_mean_pool does, every node of the batch is pooled into one."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.node, self.head = nn.Linear(FEATURES, 16), nn.Linear(16, 1)

    def forward(self, x, batch=None):
        h = torch.relu(self.node(x))
        if batch is None:
            pooled = h.mean(dim=0, keepdim=True)
        else:
            graphs = int(batch.max()) + 1
            pooled = torch.zeros(graphs, h.shape[1]).index_add_(0, batch, h) / torch.bincount(batch).unsqueeze(1)
        return self.head(pooled).view(-1)


def graph_batches(graphs: int = 64, nodes: int = 6) -> list:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(graphs, nodes, FEATURES, generator=g)
    return [(x[i], x[i].sum().reshape(())) for i in range(graphs)]


def collate_graphs(samples):
    xs, ys = zip(*samples)
    batch = torch.cat([torch.full((len(x),), i) for i, x in enumerate(xs)])
    return torch.cat(xs), batch, torch.stack(ys)


@pytest.mark.parametrize("passes_batch", [False, True])
def test_a_graph_readout_without_the_batch_vector_makes_one_prediction(passes_batch):
    def loss(model, data):
        x, batch, y = data
        return F.mse_loss(model(x, batch if passes_batch else None), y)

    report = preflight(GraphRegressor(), DataLoader(graph_batches(), batch_size=32, shuffle=True,
                                                    collate_fn=collate_graphs), loss)
    found = issues(report).get("LOSS_ONE_PREDICTION")
    if passes_batch:
        assert found is None and "LOSS_BROADCAST" not in issues(report)
    else:
        assert found is not None and found.severity == Severity.ERROR
        assert "(1,)" in found.message and "(32,)" in found.message and "batch vector" in found.message
        assert "global_mean_pool(x, data.batch)" in found.fix


class DotRecommender(nn.Module):
    def __init__(self, per_row: bool):
        super().__init__()
        torch.manual_seed(0)
        self.per_row, self.users, self.items = per_row, nn.Embedding(50, 8), nn.Embedding(80, 8)

    def forward(self, ids):
        product = self.users(ids[:, 0]) * self.items(ids[:, 1])
        return product.sum(dim=1) if self.per_row else product.sum()


@pytest.mark.parametrize("per_row", [False, True])
def test_a_dot_product_summed_without_dim_is_named(per_row):
    g = torch.Generator().manual_seed(2)
    ids = torch.stack([torch.randint(0, 50, (256,), generator=g), torch.randint(0, 80, (256,), generator=g)], 1)
    report = preflight(DotRecommender(per_row), loader(ids, torch.rand(256, generator=g) * 5), nn.MSELoss())
    found = issues(report).get("LOSS_ONE_PREDICTION")
    assert (found is None) == per_row
    if found is not None:
        assert ".sum() with no dim" in found.message and "(u * v).sum(dim=1)" in found.fix


@pytest.mark.parametrize("target", [lambda x: x.sum(1, keepdim=True), lambda x: x.sum(1)])
def test_matching_regression_shapes_are_quiet(target):
    x = features()

    def loss(model, batch):
        inputs, y = batch
        prediction = model(inputs)
        return F.mse_loss(prediction.view_as(y), y) + 1e-4 * F.l1_loss(prediction, torch.zeros(()))  # scalar target

    report = preflight(mlp(1), loader(x, target(x)), loss)
    assert not issues(report), issues(report)


# --------------------------------------------------------- the normalisation dimension
class Tagger(nn.Module):
    """(B, T) tokens -> (B, T, C) log-probabilities over ``dim``."""

    def __init__(self, dim: int):
        super().__init__()
        torch.manual_seed(0)
        self.dim = dim
        self.embed, self.head = nn.Embedding(VOCAB, 16), nn.Linear(16, TAGS)

    def forward(self, tokens):
        return F.log_softmax(self.head(self.embed(tokens)), dim=self.dim)


def tagging_data(samples: int = 256, length: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, VOCAB, (samples, length), generator=generator),
            torch.randint(0, TAGS, (samples, length), generator=generator))


def nll_over_positions(model, batch):
    tokens, tags = batch
    return F.nll_loss(model(tokens).transpose(1, 2), tags)  # classes to dim 1, as nll_loss wants


def test_log_softmax_over_the_time_dim_is_named_not_called_raw_logits():
    report = preflight(Tagger(dim=1), loader(*tagging_data()), nll_over_positions)
    found = issues(report)
    assert set(found) == {"LOSS_NORM_DIM"}, found  # not O16 "raw logits", whose fix repeats the bug
    issue = found["LOSS_NORM_DIM"]
    assert "dim 2 (size 12)" in issue.message and f"{TAGS} classes from dim 1" in issue.message
    assert "dim=-1" in issue.fix and f"size {TAGS}" in issue.fix


def test_log_softmax_over_the_class_dim_is_quiet():
    report = preflight(Tagger(dim=-1), loader(*tagging_data()), nll_over_positions)
    assert not issues(report), issues(report)


def test_softmax_over_the_batch_into_cross_entropy():
    x = features()
    model = nn.Sequential(mlp(CLASSES), nn.Softmax(dim=0))
    report = preflight(model, loader(x, torch.randint(0, CLASSES, (256,))), nn.CrossEntropyLoss())
    issue = issues(report)["LOSS_NORM_DIM"]
    assert "dim 0 (size 32)" in issue.message and "raw logits" in issue.fix
    assert "O12" not in issues(report)


# -------------------------------------------------------------------- target classes
def test_targets_of_one_class_warn():
    x = features()
    report = preflight(mlp(CLASSES), loader(x, torch.ones(256, dtype=torch.long)), nn.CrossEntropyLoss())
    issue = issues(report)["TARGET_ONE_CLASS"]
    assert issue.severity == Severity.WARNING and "every target is 1" in issue.message and "one class of the model's 5 classes" in issue.message


def test_a_binary_task_whose_first_batches_hold_no_positive_is_quiet():
    """5% positives, all of them after the first four batches of an unshuffled loader."""
    x = features()
    labels = torch.zeros(256, dtype=torch.long)
    labels[128::10] = 1
    report = preflight(mlp(2), loader(x, labels, shuffle=False), nn.CrossEntropyLoss())
    assert "TARGET_ONE_CLASS" not in issues(report)
    bce = loader(x, labels.float().unsqueeze(1), shuffle=False)
    assert "TARGET_ONE_CLASS" not in issues(preflight(mlp(1), bce, nn.BCEWithLogitsLoss()))


def test_a_small_batch_of_one_class_says_nothing_on_its_own():
    x = features(16)  # the whole epoch: 16 targets, too few to call it one class
    report = preflight(mlp(CLASSES), loader(x, torch.full((16,), 3), batch_size=8), nn.CrossEntropyLoss())
    assert "TARGET_ONE_CLASS" not in issues(report)


def test_multi_hot_rows_into_cross_entropy():
    x = features()
    multi_hot = (torch.rand(256, CLASSES, generator=torch.Generator().manual_seed(1)) < 0.4).float()
    multi_hot[:, 0] = 1  # at least one label per row, several in most
    report = preflight(mlp(CLASSES), loader(x, multi_hot), nn.CrossEntropyLoss())
    issue = issues(report)["TARGET_MULTI_HOT"]
    assert issue.severity == Severity.ERROR and "BCEWithLogitsLoss" in issue.fix
    # the fix works: the same targets into BCEWithLogitsLoss are a healthy multi-label setup
    assert not issues(preflight(mlp(CLASSES), loader(x, multi_hot), nn.BCEWithLogitsLoss()))


@pytest.mark.parametrize("soft", ["one_hot", "soft", "smoothing"])
def test_probability_targets_and_label_smoothing_are_quiet(soft):
    x = features()
    labels = torch.randint(0, CLASSES, (256,), generator=torch.Generator().manual_seed(2))
    if soft == "one_hot":
        targets, criterion = F.one_hot(labels, CLASSES).float(), nn.CrossEntropyLoss()
    elif soft == "soft":
        targets, criterion = torch.softmax(torch.randn(256, CLASSES), dim=1), nn.CrossEntropyLoss()
    else:
        targets, criterion = labels, nn.CrossEntropyLoss(label_smoothing=0.1)
    report = preflight(mlp(CLASSES), loader(x, targets), criterion)
    assert not issues(report), issues(report)


# ------------------------------------------------------------------ ignored targets
def test_all_targets_ignored_is_named_instead_of_a_nan_diagnosis():
    x = features()
    report = preflight(mlp(CLASSES), loader(x, torch.full((256,), -100)), nn.CrossEntropyLoss())
    found = issues(report)
    assert "LOSS_NONFINITE" not in found
    issue = found["TARGET_ALL_IGNORED"]
    assert issue.severity == Severity.ERROR and "ignore_index (-100)" in issue.message and "NaN" in issue.message
    assert report.check("step.first_step").issues[0].code == "TARGET_ALL_IGNORED"


def test_all_targets_ignored_under_a_sum_is_caught_by_the_targets_check():
    x = features()
    report = preflight(mlp(CLASSES), loader(x, torch.full((256,), -100)), nn.CrossEntropyLoss(reduction="sum"))
    assert "TARGET_ALL_IGNORED" in {issue.code for issue in report.check("step.targets").issues}


def _sequence_labels(keep_rows: int, keep_per_row: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, tags = tagging_data()
    labels = torch.full_like(tags, -100)
    labels[:, :keep_per_row] = tags[:, :keep_per_row]
    labels[keep_rows:] = -100
    return tokens, labels


def tagger_ce(model, batch):
    tokens, tags = batch
    return F.cross_entropy(model.head(model.embed(tokens)).reshape(-1, TAGS), tags.reshape(-1))


def test_nearly_every_target_ignored_with_empty_rows_warns():
    tokens, labels = _sequence_labels(keep_rows=0, keep_per_row=1)
    labels[::16, 0] = tagging_data()[1][::16, 0]  # 2 of 32 rows keep one target: 99.5% ignored
    report = preflight(Tagger(dim=-1), loader(tokens, labels, shuffle=False), tagger_ce)
    issue = issues(report)["TARGET_MOSTLY_IGNORED"]
    assert "30 of 32 rows have no target" in issue.message


def test_one_answer_token_per_row_is_a_healthy_prompt_masked_fine_tune():
    tokens, labels = _sequence_labels(keep_rows=256, keep_per_row=1)  # 92% ignored, every row trains
    tokens, labels = torch.cat([tokens, tokens], 1), torch.cat([labels, torch.full_like(labels, -100)], 1)  # 96%
    report = preflight(Tagger(dim=-1), loader(tokens, labels), tagger_ce)
    assert not issues(report), issues(report)


# ------------------------------------------------------------ the sequence batch axis
class Sequences(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        length = int(torch.randint(5, 20, (1,), generator=generator))
        return torch.randn(length, FEATURES, generator=generator), torch.randint(0, 3, (length,), generator=generator)


def collate(batch_first: bool):
    def stack(items):
        pad = nn.utils.rnn.pad_sequence
        return (pad([x for x, _ in items], batch_first=batch_first),
                pad([y for _, y in items], batch_first=batch_first, padding_value=-100))
    return stack


class RecurrentTagger(nn.Module):
    def __init__(self, batch_first: bool, transpose: bool = False, cell: type[nn.Module] = nn.LSTM):
        super().__init__()
        torch.manual_seed(0)
        self.transpose = transpose
        self.rnn, self.head = cell(FEATURES, 16, batch_first=batch_first), nn.Linear(16, 3)

    def forward(self, x):
        if self.transpose:
            x = x.transpose(0, 1)
        out, _ = self.rnn(x)
        return self.head(out.transpose(0, 1) if self.transpose else out)


def per_position(model, batch):
    x, y = batch
    return F.cross_entropy(model(x).reshape(-1, 3), y.reshape(-1))


def sequences(batch_first: bool) -> DataLoader:
    return DataLoader(Sequences(), batch_size=8, shuffle=True, collate_fn=collate(batch_first))


def test_a_time_major_batch_into_a_batch_first_lstm():
    report = preflight(RecurrentTagger(batch_first=True), sequences(batch_first=False), per_position)
    issue = issues(report)["BATCH_TIME_MAJOR"]
    assert "batch_first=True" in issue.message and "batch_first=True" in issue.fix


def test_a_batch_major_batch_into_a_default_gru():
    report = preflight(RecurrentTagger(batch_first=False, cell=nn.GRU), sequences(batch_first=True), per_position)
    assert "nn.GRU(..., batch_first=True)" in issues(report)["BATCH_NOT_TIME_MAJOR"].fix


@pytest.mark.parametrize(("model_batch_first", "data_batch_first", "transpose"), [
    (True, True, False), (False, False, False), (True, False, True),
])
def test_sequence_modules_reading_the_batch_axis_right_are_quiet(model_batch_first, data_batch_first, transpose):
    model = RecurrentTagger(batch_first=model_batch_first, transpose=transpose)
    report = preflight(model, sequences(batch_first=data_batch_first), per_position)
    assert not issues(report), issues(report)


class BatchifiedStream(Dataset):
    """The classic word-LM data: one token stream cut into ``streams`` columns (batchify),
    each item a ready (time, streams) chunk and its next-token targets; loaded with
    batch_size=None, so the loader states no batch size."""

    def __init__(self, streams: int = 10, bptt: int = 12, time_major: bool = True):
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, VOCAB, (streams * 200,), generator=g)
        self.data = tokens.view(streams, -1).t().contiguous()  # (time, streams)
        self.bptt, self.time_major = bptt, time_major

    def __len__(self) -> int:
        return (self.data.shape[0] - 1) // self.bptt

    def __getitem__(self, index):
        start = index * self.bptt
        chunk, targets = self.data[start:start + self.bptt], self.data[start + 1:start + 1 + self.bptt]
        return (chunk, targets) if self.time_major else (chunk.t().contiguous(), targets.t().contiguous())


class WordLM(nn.Module):
    def __init__(self, batch_first: bool):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.rnn = nn.Embedding(VOCAB, 16), nn.LSTM(16, 16, batch_first=batch_first)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, tokens):
        return self.head(self.rnn(self.embed(tokens))[0])


def next_token(model, batch):
    tokens, targets = batch
    return F.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))


def test_batchified_time_major_streams_into_a_batch_first_lstm():
    loader = DataLoader(BatchifiedStream(time_major=True), batch_size=None, shuffle=False)
    issue = issues(preflight(WordLM(batch_first=True), loader, next_token))["BATCH_TIME_MAJOR"]
    assert "shifted by one along dim 0 of (12, 10)" in issue.message and "x.t()" in issue.fix


@pytest.mark.parametrize(("model_batch_first", "time_major"), [(False, True), (True, False)])
def test_batchified_streams_read_along_their_time_axis_are_quiet(model_batch_first, time_major):
    loader = DataLoader(BatchifiedStream(time_major=time_major), batch_size=None, shuffle=False)
    assert not issues(preflight(WordLM(batch_first=model_batch_first), loader, next_token))


def test_time_major_lm_chunks_whose_length_equals_the_batch_size():
    # A custom collate stacks (bptt=10) chunks of 10 streams along dim 1: (10, 10), where the
    # batch size cannot tell time from samples; the next-token targets can.
    data = BatchifiedStream(streams=1, bptt=10)
    windows = [(data.data[i:i + 10, 0], data.data[i + 1:i + 11, 0]) for i in range(0, 180, 10)]
    stack = lambda items: tuple(torch.stack(column, dim=1) for column in zip(*items))  # noqa: E731
    loader = DataLoader(windows, batch_size=10, shuffle=True, collate_fn=stack)
    assert "BATCH_TIME_MAJOR" in issues(preflight(WordLM(batch_first=True), loader, next_token))


def test_batchified_batch_major_streams_into_a_time_major_lstm():
    loader = DataLoader(BatchifiedStream(time_major=False), batch_size=None, shuffle=False)
    assert "BATCH_NOT_TIME_MAJOR" in issues(preflight(WordLM(batch_first=False), loader, next_token))


def test_a_packed_lstm_is_quiet():
    class Packed(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.rnn, self.head = nn.LSTM(FEATURES, 16, batch_first=True), nn.Linear(16, 3)

        def forward(self, x, lengths):
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, _ = self.rnn(packed)
            return self.head(nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0])

    def loss(model, batch):
        x, y = batch
        lengths = (y != -100).sum(1)
        return F.cross_entropy(model(x, lengths).reshape(-1, 3), y.reshape(-1))

    report = preflight(Packed(), sequences(batch_first=True), loss)
    assert not issues(report), issues(report)


def test_log_softmax_over_time_then_flattened_for_nll_loss():
    def flattened(model, batch):
        tokens, tags = batch
        return F.nll_loss(model(tokens).reshape(-1, TAGS), tags.reshape(-1))

    report = preflight(Tagger(dim=1), loader(*tagging_data()), flattened)
    found = issues(report)
    assert set(found) == {"LOSS_NORM_DIM"}, found
    assert "the 12 positions of each sequence" in found["LOSS_NORM_DIM"].message
    assert not issues(preflight(Tagger(dim=-1), loader(*tagging_data()), flattened))


def test_kl_div_against_a_prior_is_quiet_and_against_a_transposed_target_is_not():
    x = features()
    prior = torch.softmax(torch.randn(1, CLASSES), dim=1)

    def to_prior(model, batch):
        return F.kl_div(F.log_softmax(model(batch[0]), dim=1), prior, reduction="batchmean")

    assert not issues(preflight(mlp(CLASSES), loader(x, torch.zeros(256)), to_prior))

    def per_sample(model, batch):
        inputs, targets = batch
        return F.kl_div(F.log_softmax(model(inputs), dim=1)[:, :1], targets.unsqueeze(0), reduction="batchmean")

    assert "LOSS_BROADCAST" in issues(preflight(mlp(CLASSES), loader(x, torch.rand(256)), per_sample))


def test_bce_with_a_column_prediction_and_a_flat_target_gets_the_view_as_its_fix():
    x = features()
    report = preflight(mlp(1), loader(x, (x[:, 0] > 0).float()), nn.BCEWithLogitsLoss())
    issue = issues(report)["STEP_ERROR"]
    assert "prediction.squeeze(-1)" in issue.fix


def test_a_constant_target_built_in_compute_loss_is_not_a_one_class_dataset():
    """MoCo's InfoNCE: the positive logit first, labels = zeros(N); nothing in the batch is constant."""
    x = features()

    def info_nce(model, batch):
        embeddings = F.normalize(model(batch[0]), dim=1)
        positives = (embeddings * embeddings.roll(1, 0)).sum(1, keepdim=True)
        logits = torch.cat([positives, embeddings @ embeddings.roll(2, 0).T], dim=1) / 0.07
        return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long))

    report = preflight(mlp(16), loader(x, torch.randint(0, 3, (256,)), batch_size=256), info_nce)
    assert "TARGET_ONE_CLASS" not in issues(report)


def test_a_target_made_from_column_ids_by_argmax_is_one_class():
    """(B, 1) class ids turned into the target with argmax(dim=1): always 0."""
    x = features()
    labels = torch.randint(0, CLASSES, (256, 1), generator=torch.Generator().manual_seed(1))

    def argmax_of_ids(model, batch):
        return F.cross_entropy(model(batch[0]), batch[1].argmax(dim=1))

    def squeezed(model, batch):
        return F.cross_entropy(model(batch[0]), batch[1].squeeze(1))

    found = issues(preflight(mlp(CLASSES), loader(x, labels), argmax_of_ids))
    assert "TARGET_ONE_CLASS" in found and "y.squeeze(1)" in found["TARGET_ONE_CLASS"].fix
    assert "TARGET_ONE_CLASS" not in issues(preflight(mlp(CLASSES), loader(x, labels), squeezed))


# --------------------------------------------------------- more healthy setups, all quiet
class Segmenter(nn.Module):
    def __init__(self, classes: int):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, classes, 3, padding=1)

    def forward(self, images):
        return self.conv(images)


class Encoder(nn.Module):
    """A batch-first transformer classifier over (B, T, F) features."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(FEATURES, 2, 16, batch_first=True, dropout=0.0)
        self.encoder, self.head = nn.TransformerEncoder(layer, 1), nn.Linear(FEATURES, CLASSES)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


def _segmentation(binary: bool):
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(64, 3, 8, 8, generator=generator)
    if binary:
        return Segmenter(1), loader(images, (torch.rand(64, 1, 8, 8, generator=generator) > 0.5).float(),
                                    batch_size=16), nn.BCEWithLogitsLoss()
    masks = torch.randint(0, 3, (64, 8, 8), generator=generator)
    masks[:, 0] = 255  # an unlabelled border
    return Segmenter(3), loader(images, masks, batch_size=16), nn.CrossEntropyLoss(ignore_index=255)


def _distillation():
    teacher = mlp(CLASSES).requires_grad_(False)

    def loss(model, batch):
        inputs, labels = batch
        logits = model(inputs)
        soft = F.kl_div(F.log_softmax(logits / 2, dim=1), F.softmax(teacher(inputs) / 2, dim=1), reduction="batchmean")
        return F.cross_entropy(logits, labels) + soft

    x = features()
    return mlp(CLASSES), loader(x, torch.randint(0, CLASSES, (256,))), loss


def _transformer():
    x = torch.randn(64, 10, FEATURES, generator=torch.Generator().manual_seed(0))
    return Encoder(), loader(x, torch.randint(0, CLASSES, (64,)), batch_size=16), nn.CrossEntropyLoss()


def _focal():
    x = features()

    def loss(model, batch):
        inputs, targets = batch
        logits = model(inputs).squeeze(-1)
        bce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        return ((1 - torch.exp(-bce)) ** 2 * bce).mean()

    return mlp(1), loader(x, (x[:, 0] > 1.5).float()), loss


@pytest.mark.parametrize("setup", [lambda: _segmentation(False), lambda: _segmentation(True), _distillation,
                                   _transformer, _focal],
                         ids=["segmentation-ce", "segmentation-bce", "distillation", "transformer", "focal"])
def test_more_healthy_setups_are_quiet(setup):
    model, data, loss = setup()
    report = preflight(model, data, loss)
    assert not set(issues(report)) & NEW_CODES, issues(report)


def test_reading_on_for_labels_leaves_the_loaders_order_unchanged():
    """The one-class scan iterates the loader past the first batch; training then sees
    the same shuffled order as without the preflight."""
    x = features()
    order = torch.cat(list(DataLoader(range(256), batch_size=32, shuffle=True,
                                      generator=torch.Generator().manual_seed(7))))
    labels = torch.zeros(256, dtype=torch.long)
    labels[order[64::10]] = 1  # none in the first two batches: the scan reads on

    def seeded():
        return DataLoader(TensorDataset(x, labels), batch_size=32, shuffle=True,
                          generator=torch.Generator().manual_seed(7))

    checked, plain = seeded(), seeded()
    torch.manual_seed(3)
    report = preflight(mlp(2), checked, nn.CrossEntropyLoss())
    assert report.check("step.targets").data["one_class_scan"]["batches"] == 3  # another class in the third
    assert "TARGET_ONE_CLASS" not in issues(report)
    torch.manual_seed(3)
    for (a, _), (b, _) in zip(checked, plain, strict=True):
        assert torch.equal(a, b)


def test_class_labels_stored_as_a_column_get_the_squeeze_as_their_fix():
    x = features()
    report = preflight(mlp(CLASSES), loader(x, torch.randint(0, CLASSES, (256, 1))), nn.CrossEntropyLoss())
    issue = issues(report)["STEP_ERROR"]
    assert "target.squeeze(-1)" in issue.fix and "(32, 1)" in issue.fix


# ------------------------------------------------------------ an activation on the output layer
def test_logits_through_a_relu_on_the_output_layer_warn():
    x = features()
    head = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES), nn.ReLU())
    found = issues(preflight(head, loader(x, x[:, :CLASSES].argmax(1)), nn.CrossEntropyLoss()))["O12"]
    assert "never negative" in found.message and "a ReLU sits on the output layer" in found.message
    assert "Remove the activation" in found.fix


def test_raw_logits_and_binary_logits_are_quiet():
    x = features()
    assert not issues(preflight(mlp(CLASSES), loader(x, x[:, :CLASSES].argmax(1)), nn.CrossEntropyLoss()))
    # A head on pooled ReLU features may start with every class positive: no zeros, no warning.
    torch.manual_seed(0)
    positive = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))
    with torch.no_grad():
        positive[2].bias.fill_(5.0)
    assert not issues(preflight(positive, loader(x, x[:, :CLASSES].argmax(1)), nn.CrossEntropyLoss()))
    binary = lambda model, batch: F.binary_cross_entropy_with_logits(model(batch[0]), batch[1])  # noqa: E731
    assert not issues(preflight(mlp(3), loader(x, (x[:, :3] > 0).float()), binary))


# ------------------------------------------------------------ a learning rate of 0
def test_a_learning_rate_of_zero_without_a_scheduler_is_an_error():
    x = features()
    model = mlp(CLASSES)
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.0), loader(x, x[:, :CLASSES].argmax(1)),
                           loss_fn=nn.CrossEntropyLoss())
    found = [issue for _, issue in report.issues() if issue.code == "O8"]
    assert [issue.severity for issue in found] == [Severity.ERROR] and "learning rate is 0" in found[0].message


def test_one_group_at_lr_zero_is_a_warning_naming_its_parameters():
    x = features()
    model = mlp(CLASSES)
    groups = [{"params": model[0].parameters(), "lr": 0.0}, {"params": model[2].parameters(), "lr": 0.1}]
    report = run_preflight(model, torch.optim.SGD(groups), loader(x, x[:, :CLASSES].argmax(1)),
                           loss_fn=nn.CrossEntropyLoss())
    found = [issue for _, issue in report.issues() if issue.code == "O8"]
    # A warning, not a note: set d's fine-tune whose new head inherited lr=0 trained nothing but its backbone.
    assert [issue.severity for issue in found] == [Severity.WARNING] and "group(s) 0 have lr=0" in found[0].message
    assert "0.weight, 0.bias" in found[0].message and "requires_grad_(False)" in found[0].fix


# ------------------------------------------------------------ softmax into BCE
def multi_hot(x: torch.Tensor, labels: int = 6) -> torch.Tensor:
    """Several tags per sample: the first `labels` features' signs."""
    return (x[:, :labels] > 0).float()


def test_softmax_into_bce_with_several_labels_per_sample_is_an_error():
    x = features()
    model = mlp(6)
    tags = multi_hot(x)
    assert int(tags.sum(dim=1).max()) > 1
    loss = lambda m, b: F.binary_cross_entropy(torch.softmax(m(b[0]), dim=1), b[1])  # noqa: E731
    issue = issues(preflight(model, loader(x, tags), loss))["LOSS_SOFTMAX_BCE"]
    assert issue.severity == Severity.ERROR and "compete" in issue.message and "BCEWithLogitsLoss" in issue.fix


def test_softmax_into_bce_with_one_hot_targets_is_a_warning_pointing_at_cross_entropy():
    x = features()
    one_hot = F.one_hot(x[:, :CLASSES].argmax(1), CLASSES).float()
    loss = lambda m, b: F.binary_cross_entropy(torch.softmax(m(b[0]), dim=1), b[1])  # noqa: E731
    issue = issues(preflight(mlp(CLASSES), loader(x, one_hot), loss))["LOSS_SOFTMAX_BCE"]
    assert issue.severity == Severity.WARNING and "CrossEntropyLoss" in issue.fix


def test_multi_label_with_sigmoid_or_logits_is_not_softmax_into_bce():
    x = features()
    tags = multi_hot(x)
    with_logits = lambda m, b: F.binary_cross_entropy_with_logits(m(b[0]), b[1])  # noqa: E731
    assert not issues(preflight(mlp(6), loader(x, tags), with_logits))
    sigmoid = lambda m, b: F.binary_cross_entropy(torch.sigmoid(m(b[0])), b[1])  # noqa: E731
    assert "LOSS_SOFTMAX_BCE" not in issues(preflight(mlp(6), loader(x, tags), sigmoid))


# ------------------------------------------------------------ kl_div's normalisation dim
def distillation(student_dim: int, log_target: bool = False):
    torch.manual_seed(1)
    teacher = mlp(CLASSES)
    temperature = 2.0

    def loss(model, batch):
        inputs, labels = batch
        with torch.no_grad():
            soft = teacher(inputs) / temperature
            soft = F.log_softmax(soft, dim=-1) if log_target else F.softmax(soft, dim=-1)
        student = F.log_softmax(model(inputs) / temperature, dim=student_dim)
        kd = F.kl_div(student, soft, reduction="batchmean", log_target=log_target) * temperature ** 2
        return 0.5 * kd + 0.5 * F.cross_entropy(model(inputs), labels)

    return loss


def test_a_distillation_log_softmax_over_the_batch_is_named():
    x = features()
    issue = issues(preflight(mlp(CLASSES), loader(x, x[:, :CLASSES].argmax(1)), distillation(0)))["LOSS_NORM_DIM"]
    assert "kl_div" in issue.message and "dim 0 (the batch)" in issue.message and "dim=-1" in issue.fix


@pytest.mark.parametrize("log_target", [False, True])
def test_a_distillation_over_the_classes_is_quiet(log_target):
    x = features()
    assert not issues(preflight(mlp(CLASSES), loader(x, x[:, :CLASSES].argmax(1)), distillation(-1, log_target)))


class SequenceStudent(nn.Module):
    """(B, T) tokens -> (B, T, C) raw logits."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(VOCAB, 16), nn.Linear(16, TAGS)

    def forward(self, tokens):
        return self.head(self.embed(tokens))


@pytest.mark.parametrize("teacher_dim, fires", [(1, True), (-1, False)])
def test_a_per_token_distillation_target_softmaxed_over_time_is_named(teacher_dim, fires):
    """Cached (B, T, C) teacher logits: softmax(dim=1) makes each soft target a distribution
    over the 12 positions, while the student's log_softmax runs over the classes."""
    tokens, _ = tagging_data()
    teacher_logits = torch.randn(len(tokens), tokens.shape[1], TAGS, generator=torch.Generator().manual_seed(3))

    def token_distillation(model, batch):
        inputs, cached = batch
        soft = F.softmax(cached / 2.0, dim=teacher_dim)
        return F.kl_div(F.log_softmax(model(inputs) / 2.0, dim=-1), soft, reduction="batchmean") * 4.0

    found = issues(preflight(SequenceStudent(), loader(tokens, teacher_logits), token_distillation))
    if not fires:
        assert "LOSS_NORM_DIM" not in found, found
        return
    issue = found["LOSS_NORM_DIM"]
    assert "target" in issue.message and "dim 1" in issue.message and "size 12" in issue.message
    assert "dim=-1" in issue.fix and "not dim=1" in issue.fix


# ------------------------------------------------------------ a bounded output vs regression targets
def regressor(*head: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1), *head, nn.Flatten(0))


def nonlinear_target(x: torch.Tensor) -> torch.Tensor:
    return x[:, 0] * x[:, 1] + x[:, 2].abs()


@pytest.mark.parametrize("head, target, words", [
    ((nn.Sigmoid(),), lambda t: 50 + 20 * t, "sigmoid, so they stay in [0, 1]"),          # prices after a sigmoid
    ((nn.ReLU(),), lambda t: (t - t.mean()) / t.std(), "relu, so they stay in [0, inf]"),  # standardised targets
    ((nn.Tanh(),), lambda t: 3 + t, "tanh, so they stay in [-1, 1]"),
])
def test_a_bounded_output_activation_that_cannot_reach_the_targets_is_an_error(head, target, words):
    x = features()
    issue = issues(preflight(regressor(*head), loader(x, target(nonlinear_target(x))), nn.MSELoss()))["LOSS_OUTPUT_RANGE"]
    assert words in issue.message and ("Scale the tanh" if isinstance(head[0], nn.Tanh) else "Remove the") in issue.fix
    # the standardised targets are named as negative below the relu's floor, the tanh's 3 + t are not
    assert ("standardised (z-scored, zero-mean) targets are negative" in issue.message) == isinstance(head[0], nn.ReLU)



def test_box_targets_above_one_under_a_sigmoid_name_an_image_resized_without_its_boxes():
    # 64 px images resized to 32 in the Dataset, boxes kept in 64 px and divided by 32: up to 2.0
    x = features()
    g = torch.Generator().manual_seed(4)
    corner = torch.rand(len(x), 2, generator=g) * 40
    boxes = torch.cat([corner, corner + 8 + torch.rand(len(x), 2, generator=g) * 16], 1) / 32
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 4), nn.Sigmoid())
    issue = issues(preflight(head, loader(x, boxes), nn.SmoothL1Loss()))["LOSS_OUTPUT_RANGE"]
    assert "coordinates (4 per row)" in issue.message and "resized" in issue.message
    assert "Resize the boxes with the image" in issue.fix


class BoundedPolicy(nn.Module):
    """A behaviour-cloning policy head: bound * tanh(mlp(state))."""

    def __init__(self, bound: float):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.bound = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 2)), bound

    def forward(self, state):
        return self.bound * torch.tanh(self.body(state))


@pytest.mark.parametrize("bound", [1.0, 2.5])
def test_a_tanh_scaled_by_a_constant_is_read_at_its_scale(bound):
    x = features()
    actions = (2.5 * torch.tanh(x[:, :2] * 2)).clamp(-2.49, 2.49)  # actuator commands in [-2.5, 2.5]
    found = issues(preflight(BoundedPolicy(bound), loader(x, actions), nn.MSELoss())).get("LOSS_OUTPUT_RANGE")
    if bound == 2.5:
        assert found is None
    else:
        assert "tanh, so they stay in [-1, 1]" in found.message and "2.5 * torch.tanh(h)" in found.fix


@pytest.mark.parametrize("head, target", [
    ((nn.Sigmoid(),), lambda t: torch.sigmoid(t)),          # probabilities as targets
    ((nn.Softplus(),), lambda t: t.abs()),                  # positive targets
    ((), lambda t: (t - t.mean()) / t.std()),               # a linear head
])
def test_a_bounded_output_whose_range_holds_the_targets_is_quiet(head, target):
    x = features()
    assert not issues(preflight(regressor(*head), loader(x, target(nonlinear_target(x))), nn.MSELoss()))


class BiEncoder(nn.Module):
    """Two sentences' features, one shared encoder; the prediction is their cosine similarity."""

    def __init__(self, by_normalize: bool):
        super().__init__()
        torch.manual_seed(0)
        self.encode, self.by_normalize = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 8)), by_normalize

    def forward(self, a, b):
        za, zb = self.encode(a), self.encode(b)
        if self.by_normalize:
            return (F.normalize(za, dim=-1) * F.normalize(zb, dim=-1)).sum(-1)
        return F.cosine_similarity(za, zb, dim=-1)


@pytest.mark.parametrize("by_normalize", [False, True], ids=["cosine_similarity", "normalize_dot"])
@pytest.mark.parametrize(("scale", "fires"), [(1.0, True), (5.0, False)], ids=["gold_0_to_5", "divided_by_5"])
def test_a_cosine_regressed_onto_scores_outside_minus_one_one_is_an_error(by_normalize, scale, fires):
    a, b = features(), torch.randn(256, FEATURES, generator=torch.Generator().manual_seed(1))
    gold = 5 * torch.rand(256, generator=torch.Generator().manual_seed(2))  # STS scores in [0, 5]

    def sts_loss(model, batch):
        return F.mse_loss(model(batch[0], batch[1]), batch[2] / scale)

    found = issues(preflight(BiEncoder(by_normalize), loader(a, b, gold), sts_loss)).get("LOSS_OUTPUT_RANGE")
    assert bool(found) == fires
    if found:
        assert "cosine similarity, so they stay in [-1, 1]" in found.message and "scores / 5" in found.fix


# ------------------------------------------------------------ regression targets cast to integers
def float_mse(model, batch):
    return F.mse_loss(model(batch[0]), batch[1].float())


def test_standardised_targets_cast_to_long_are_a_warning():
    x = features()
    target = nonlinear_target(x)
    standardised = ((target - target.mean()) / target.std()).long()  # a class dataset's cast
    issue = issues(preflight(regressor(), loader(x, standardised), float_mse))["TARGET_TRUNCATED"]
    assert "whole numbers" in issue.message and ".long()" in issue.message and "float32" in issue.fix


@pytest.mark.parametrize("target", [
    lambda t: (t.abs() * 2).round().clamp(1, 5),      # star ratings: whole numbers on purpose
    lambda t: (t.abs() * 3).floor(),                  # counts
    lambda t: (t - t.mean()) / t.std(),               # standardised floats
])
def test_whole_number_targets_that_are_meant_and_floats_are_quiet(target):
    x = features()
    assert "TARGET_TRUNCATED" not in issues(preflight(regressor(), loader(x, target(nonlinear_target(x))), float_mse))


# ------------------------------------------------------------ F.normalize over the batch
def contrastive(dim: int, stacked: bool = False):
    """InfoNCE between two noisy views of each sample, the embeddings normalised with F.normalize."""

    def loss(model, batch):
        inputs, _ = batch
        views = torch.cat([inputs + 0.1 * torch.randn_like(inputs), inputs + 0.1 * torch.randn_like(inputs)])
        if stacked:
            z = F.normalize(model(views), dim=dim)
            a, b = z.chunk(2)
        else:
            a, b = (F.normalize(model(view), dim=dim) for view in views.chunk(2))
        logits = a @ b.t() / 0.1
        return F.cross_entropy(logits, torch.arange(len(a)))

    return loss


@pytest.mark.parametrize("stacked", [False, True])
def test_normalising_embeddings_over_the_batch_is_named(stacked):
    x = features()
    issue = issues(preflight(mlp(12), loader(x, x[:, 0]), contrastive(0, stacked)))["LOSS_NORM_DIM"]
    assert "F.normalize(z, dim=0)" in issue.message and "dim=-1" in issue.fix


@pytest.mark.parametrize("dim", [1, -1])
def test_normalising_each_embedding_is_quiet(dim):
    x = features()
    assert "LOSS_NORM_DIM" not in issues(preflight(mlp(12), loader(x, x[:, 0]), contrastive(dim)))


# ------------------------------------------------------------ time-major targets flattened beside batch-first logits
class GruTagger(nn.Module):
    def __init__(self, batch_first: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 16)
        self.gru = nn.GRU(16, 16, batch_first=batch_first)
        self.out = nn.Linear(16, TAGS)

    def forward(self, ids):
        return self.out(self.gru(self.embed(ids))[0])


def time_major_loader() -> DataLoader:
    ids = torch.randint(1, VOCAB, (128, 12), generator=torch.Generator().manual_seed(0))
    tags = ids % TAGS

    def collate(rows):  # torchtext-style (T, B) batches
        return torch.stack([row[0] for row in rows], 1), torch.stack([row[1] for row in rows], 1)

    return DataLoader(TensorDataset(ids, tags), batch_size=16, shuffle=True, collate_fn=collate)


def test_time_major_targets_flattened_beside_batch_first_logits_are_an_error():
    def loss(model, batch):
        text, tags = batch
        logits = model(text.t())
        return F.cross_entropy(logits.reshape(-1, TAGS), tags.reshape(-1))  # tags still (T, B)

    issue = issues(preflight(GruTagger(), time_major_loader(), loss))["TARGET_ORDER"]
    assert "(12, 16) = (T, B)" in issue.message and "(16, 12) inputs" in issue.message and "targets.t()" in issue.fix


@pytest.mark.parametrize("layout", ["transposed", "time-major throughout"])
def test_targets_flattened_in_the_logits_order_are_quiet(layout):
    def loss(model, batch):
        text, tags = batch
        if layout == "transposed":
            return F.cross_entropy(model(text.t()).reshape(-1, TAGS), tags.t().reshape(-1))
        return F.cross_entropy(model(text).reshape(-1, TAGS), tags.reshape(-1))

    model = GruTagger(batch_first=layout == "transposed")
    assert "TARGET_ORDER" not in issues(preflight(model, time_major_loader(), loss))


def test_a_0_255_mask_read_as_class_ids_with_ignore_index_255_is_named():
    g = torch.Generator().manual_seed(3)
    images = torch.randn(64, 1, 8, 8, generator=g)
    masks = torch.where(images[:, 0] > 0.8, 255, 0).long()
    model = nn.Conv2d(1, 2, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, masks), batch_size=16),
                           loss_fn=nn.CrossEntropyLoss(ignore_index=255))
    issue = issues(report)["TARGET_ONE_CLASS"]
    assert "ignore_index=255 ignores every foreground pixel" in issue.message and "ToTensor" not in issue.message
    assert "(mask > 0).long()" in issue.fix


@pytest.mark.parametrize("ignore_index, fires", [(0, True), (-100, False)])
def test_an_ignore_index_on_a_real_class_of_one_label_per_sample_warns(ignore_index, fires):
    # activity recognition: four classes, 0 ("walking") a quarter of the rows
    x = features()
    y = x[:, :4].argmax(dim=1)
    loss = lambda model, batch: F.cross_entropy(model(batch[0]), batch[1], ignore_index=ignore_index)  # noqa: E731
    found = issues(preflight(mlp(4), loader(x, y), loss)).get("TARGET_IGNORED_CLASS")
    assert (found is not None) == fires
    if fires:
        assert "ignore_index=0 is also class 0" in found.message and "real class" in found.fix


class VolumeSegmenter(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv3d(1, 3, 3, padding=1)

    def forward(self, volume):
        return self.conv(volume)


def soft_dice(softmax_dim: int | None):
    def loss(model, batch):
        volume, labels = batch
        logits = model(volume)
        if softmax_dim is None:  # soft-argmax style: positions flattened, then normalised over them
            probs = logits.flatten(2).softmax(-1).view_as(logits)
        else:
            probs = logits.softmax(dim=softmax_dim)
        onehot = F.one_hot(labels, 3).permute(0, 4, 1, 2, 3).float()
        overlap = (probs * onehot).sum((2, 3, 4))
        return 1 - (2 * overlap / (probs.sum((2, 3, 4)) + onehot.sum((2, 3, 4)) + 1e-6)).mean()
    return loss


@pytest.mark.parametrize("softmax_dim, fires", [(-1, True), (1, False), (None, False)],
                         ids=["over_W", "over_classes", "over_flattened_positions"])
def test_a_dice_softmax_over_a_spatial_axis_of_a_conv_output(softmax_dim, fires):
    g = torch.Generator().manual_seed(0)
    volumes = torch.randn(64, 1, 6, 6, 6, generator=g)
    labels = torch.randint(0, 3, (64, 6, 6, 6), generator=g)
    found = issues(preflight(VolumeSegmenter(), loader(volumes, labels, batch_size=8), soft_dice(softmax_dim)))
    assert ("LOSS_NORM_DIM" in found) == fires, found
    if fires:
        assert "dim 4 (size 6)" in found["LOSS_NORM_DIM"].message and "dim=1" in found["LOSS_NORM_DIM"].fix


def cox_partial_likelihood(model, batch):
    inputs, time, event = batch
    order = time.argsort(descending=True)
    risk = model(inputs)[order]  # (B, 1): never squeezed
    return -((risk - torch.logcumsumexp(risk, dim=0)) * event[order]).sum() / event.sum()  # * (B,): (B, B)


def test_a_risk_column_times_an_event_indicator_names_the_flag_it_ignores():
    x = features()
    time = torch.rand(len(x), generator=torch.Generator().manual_seed(1))
    event = (torch.rand(len(x), generator=torch.Generator().manual_seed(2)) < 0.6).float()
    found = issues(preflight(mlp(1), loader(x, time, event), cox_partial_likelihood))["LOSS_BROADCAST"]
    assert "0/1 vector of shape (32,)" in found.message and "event indicator" in found.message
    assert "prediction.squeeze(-1)" in found.fix
    # a residual against continuous targets keeps the every-prediction-against-every-target reading
    assert "0/1" not in issues(preflight(mlp(1), loader(x, x.sum(1)), hand_written_mse))["LOSS_BROADCAST"].message


def batch_axis_dice(dim: int):
    def loss(model, batch):
        images, masks = batch
        logits = model(images)
        probs = torch.softmax(logits, dim=dim)
        onehot = F.one_hot(masks, logits.shape[1]).permute(0, 3, 1, 2).float()
        inter, denom = (probs * onehot).sum(dim=(0, 2, 3)), probs.sum(dim=(0, 2, 3)) + onehot.sum(dim=(0, 2, 3))
        return 1 - ((2 * inter + 1) / (denom + 1)).mean()
    return loss


@pytest.mark.parametrize("dim", [0, 1])
def test_a_softmax_over_the_batch_axis_of_segmentation_logits(dim):
    g = torch.Generator().manual_seed(0)
    images, masks = torch.randn(64, 3, 12, 12, generator=g), torch.randint(0, 3, (64, 12, 12), generator=g)
    torch.manual_seed(0)
    model = nn.Conv2d(3, 3, 3, padding=1)
    found = issues(preflight(model, loader(images, masks, batch_size=16), batch_axis_dice(dim))).get("LOSS_NORM_DIM")
    assert (found is not None) == (dim == 0)
    if found is not None:
        assert "softmax over dim 0, the batch, of a (16, 3, 12, 12) tensor" in found.message and "dim=1" in found.fix


def clip_symmetric(model, batch):
    a, b = batch
    za, zb = F.normalize(model(a), dim=-1), F.normalize(model(b), dim=-1)
    logits = za @ zb.T / 0.07  # (B, B): dim 0 is the other direction's classes
    return -(torch.log_softmax(logits, dim=1).diag().mean() + torch.log_softmax(logits, dim=0).diag().mean()) / 2


def test_a_softmax_over_dim_0_of_a_similarity_table_is_no_batch_softmax():
    x = features()
    assert "LOSS_NORM_DIM" not in issues(preflight(mlp(8), loader(x, x + 0.1 * torch.randn_like(x)), clip_symmetric))


def binary_distillation(teacher_activation: str):
    torch.manual_seed(1)
    teacher = nn.Linear(FEATURES, 1).requires_grad_(False)

    def loss(model, batch):
        x, y = batch
        logit = model(x)
        soft = torch.softmax(teacher(x), dim=1) if teacher_activation == "softmax" else torch.sigmoid(teacher(x))
        return F.binary_cross_entropy_with_logits(logit, y[:, None]) + F.binary_cross_entropy_with_logits(logit, soft)
    return loss


@pytest.mark.parametrize("teacher_activation", ["softmax", "sigmoid"])
def test_a_softmax_over_a_single_logit_is_a_constant(teacher_activation):
    x = features()
    found = issues(preflight(mlp(1), loader(x, (x.sum(1) > 0).float()), binary_distillation(teacher_activation)))
    norm = found.get("LOSS_NORM_DIM")
    assert (norm is not None) == (teacher_activation == "softmax")
    if norm is not None:
        assert "a dim of size 1" in norm.message and "torch.sigmoid(logit)" in norm.fix


def multilabel_distillation(teacher_activation: str):
    torch.manual_seed(2)
    teacher = nn.Linear(FEATURES, 6).requires_grad_(False)

    def loss(model, batch):
        x, tags = batch
        logits = teacher(x) / 2.0
        soft = torch.softmax(logits, dim=1) if teacher_activation == "softmax" else torch.sigmoid(logits)
        out = model(x)
        return F.binary_cross_entropy_with_logits(out, tags) + F.binary_cross_entropy_with_logits(out, soft)
    return loss


@pytest.mark.parametrize("teacher_activation", ["softmax", "sigmoid"])
def test_soft_multi_label_targets_that_sum_to_one(teacher_activation):
    x = features()
    tags = (torch.rand(len(x), 6, generator=torch.Generator().manual_seed(5)) < 0.4).float()
    found = issues(preflight(mlp(6), loader(x, tags), multilabel_distillation(teacher_activation))).get("TARGET_MULTI_HOT")
    assert (found is not None) == (teacher_activation == "softmax")
    if found is not None:
        assert "sum to 1 over their labels" in found.message and "torch.sigmoid(teacher_logits / T)" in found.fix


class SeqTagger(nn.Module):
    def __init__(self, batch_first: bool):
        super().__init__()
        torch.manual_seed(3)
        self.rnn, self.head = nn.GRU(FEATURES, 16, batch_first=batch_first), nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def sequence_distillation(transpose_back: bool):
    teacher = SeqTagger(batch_first=False).requires_grad_(False)  # seq-first: (T, B, 3)

    def loss(model, batch):
        x, _ = batch
        student = model(x).reshape(-1, 3)  # (B * T, 3), batch-major
        with torch.no_grad():
            logits = teacher(x.transpose(0, 1))
            logits = (logits.transpose(0, 1) if transpose_back else logits).reshape(-1, 3)
        return F.kl_div(F.log_softmax(student / 2, -1), F.softmax(logits / 2, -1), reduction="batchmean")
    return loss


@pytest.mark.parametrize("transpose_back", [False, True])
def test_a_seq_first_teachers_soft_targets_flattened_against_a_batch_first_student(transpose_back):
    g = torch.Generator().manual_seed(6)
    x, tags = torch.randn(64, 12, FEATURES, generator=g), torch.randint(0, 3, (64, 12), generator=g)
    found = issues(preflight(SeqTagger(batch_first=True), loader(x, tags, batch_size=8),
                             sequence_distillation(transpose_back))).get("FLATTEN_ORDER_MISMATCH")
    assert (found is not None) == (not transpose_back)
    if found is not None:
        assert "kl_div" in found.message


def forgetting_penalty(kind: str, copied: bool):
    """Continual learning on task B: LwF distils the old model's outputs, EWC anchors the old weights."""
    torch.manual_seed(4)
    model = mlp(CLASSES)
    old_model = copy.deepcopy(model) if copied else model  # the bug: the old model is the model itself
    anchor = {n: (p.detach().clone() if copied else p) for n, p in model.named_parameters()}
    if copied:  # the old task's weights are not the current ones once task B has taken a step
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))

    def loss(m, batch):
        x, y = batch
        logits = m(x)
        if kind == "lwf":
            with torch.no_grad():
                old = old_model(x)
            term = F.kl_div(F.log_softmax(logits / 2, -1), F.softmax(old / 2, -1), reduction="batchmean")
        else:
            term = sum(((p - anchor[n]) ** 2).sum() for n, p in m.named_parameters())
        return F.cross_entropy(logits, y) + term
    return model, loss


@pytest.mark.parametrize("kind", ["lwf", "ewc"])
@pytest.mark.parametrize("copied", [False, True], ids=["the_live_model", "a_snapshot"])
def test_a_forgetting_penalty_against_the_live_model_is_constant(kind, copied):
    x = features()
    model, loss = forgetting_penalty(kind, copied)
    found = issues(preflight(model, loader(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()), loss)).get("KL_TERM_CONSTANT")
    assert (found is not None) == (not copied)
    if found is not None:
        assert ("copy.deepcopy(model)" if kind == "lwf" else "p.detach().clone()") in found.fix


def trained_teacher(x: torch.Tensor, labels: torch.Tensor) -> nn.Module:
    torch.manual_seed(7)
    teacher = nn.Linear(FEATURES, CLASSES)
    optimizer = torch.optim.Adam(teacher.parameters(), 0.05)
    for _ in range(150):
        optimizer.zero_grad()
        F.cross_entropy(teacher(x), labels).backward()
        optimizer.step()
    return teacher.requires_grad_(False)


@pytest.mark.parametrize("permuted", [True, False], ids=["teacher_in_another_class_order", "same_order"])
def test_soft_targets_whose_classes_are_in_another_order(permuted):
    x = features()
    labels = x[:, :CLASSES].argmax(1)
    teacher = trained_teacher(x, labels)
    order = torch.tensor([2, 0, 1, 4, 3]) if permuted else torch.arange(CLASSES)

    def loss(model, batch):
        inputs, y = batch
        logits = model(inputs)
        with torch.no_grad():
            soft = F.softmax(teacher(inputs)[:, order] / 2, dim=-1)
        return F.cross_entropy(logits, y) + F.kl_div(F.log_softmax(logits / 2, -1), soft, reduction="batchmean")

    found = issues(preflight(mlp(CLASSES), loader(x, labels), loss)).get("SOFT_TARGET_CLASS_ORDER")
    assert (found is not None) == permuted
    if found is not None:
        assert "renumbered" in found.message and "teacher_logits[:, order]" in found.fix


def regression_teacher(x: torch.Tensor, y: torch.Tensor) -> nn.Module:
    torch.manual_seed(8)
    teacher = nn.Linear(FEATURES, 1)
    optimizer = torch.optim.Adam(teacher.parameters(), 0.05)
    for _ in range(200):
        optimizer.zero_grad()
        F.mse_loss(teacher(x).squeeze(1), y).backward()
        optimizer.step()
    return teacher.requires_grad_(False)


@pytest.mark.parametrize("teacher_units", ["z_scored", "raw", "log_of_the_labels"])
def test_one_prediction_regressed_onto_targets_in_two_units(teacher_units):
    """A student distilled from a regression teacher fit on z-scored (or log) targets, next to the
    raw labels: the two targets rank the rows alike, in other units; a teacher in the labels' units
    is quiet."""
    x = features()
    y = 40 + 8 * x[:, 0] + 3 * x[:, 1]
    mean, std = y.mean(), y.std()
    fit_on = {"z_scored": (y - mean) / std, "raw": y, "log_of_the_labels": y.log()}[teacher_units]
    teacher = regression_teacher(x, fit_on)

    def loss(model, batch):
        inputs, target = batch
        prediction = model(inputs).squeeze(1)
        with torch.no_grad():
            taught = teacher(inputs).squeeze(1)
        return 0.5 * F.mse_loss(prediction, target) + 0.5 * F.mse_loss(prediction, taught)

    found = issues(preflight(mlp(1), loader(x, y), loss)).get("TARGETS_ON_TWO_SCALES")
    assert (found is not None) == (teacher_units != "raw")
    if found is not None:
        assert "t * std + mean" in found.fix and "correlation" in found.message


class MagnitudePruned(nn.Module):
    def __init__(self, mask_rule: str):
        super().__init__()
        self.hidden, self.head = nn.Linear(FEATURES, 64), nn.Linear(64, CLASSES)
        self.mask_rule = mask_rule

    def forward(self, x):
        w = self.hidden.weight
        threshold = w.detach().abs().flatten().kthvalue(int(0.7 * w.numel())).values
        mask = {"abs_below": w.detach().abs() < threshold, "abs_above": w.detach().abs() > threshold,
                "random": torch.rand(w.shape, generator=torch.Generator().manual_seed(0)) > 0.7}[self.mask_rule]
        return self.head(F.relu(F.linear(x, w * mask, self.hidden.bias)))


@pytest.mark.parametrize("mask_rule", ["abs_below", "abs_above", "random"])
def test_a_magnitude_mask_that_keeps_the_smallest_weights(mask_rule):
    x = features()
    found = issues(preflight(MagnitudePruned(mask_rule), loader(x, x[:, :CLASSES].argmax(1)),
                             nn.CrossEntropyLoss())).get("PRUNING_KEEPS_SMALLEST")
    assert (found is not None) == (mask_rule == "abs_below")
    if found is not None:
        assert "w.abs() > threshold" in found.fix and "zeroes 30%" in found.message


def test_a_zero_weight_under_any_mask_is_quiet():
    model = MagnitudePruned("abs_below")
    nn.init.zeros_(model.hidden.weight)
    model.mask_rule = "random"
    x = features()
    assert "PRUNING_KEEPS_SMALLEST" not in issues(preflight(model, loader(x, x[:, :CLASSES].argmax(1)), nn.CrossEntropyLoss()))


class StructurallyPruned(nn.Module):
    def __init__(self, norm_dim: int):
        super().__init__()
        self.hidden, self.head = nn.Linear(FEATURES, 64), nn.Linear(64, CLASSES)
        self.norm_dim = norm_dim

    def forward(self, x):
        w = self.hidden.weight
        norms = w.norm(dim=self.norm_dim, keepdim=True)  # dim=1: one per neuron; dim=0: one per input column
        keep = (norms >= norms.flatten().kthvalue(int(0.5 * norms.numel())).values).float()
        return self.head(F.relu(F.linear(x, w * keep, self.hidden.bias)))


@pytest.mark.parametrize("norm_dim", [0, 1], ids=["norms_per_input_column", "norms_per_neuron"])
def test_structured_pruning_over_the_input_columns(norm_dim):
    x = features()
    found = issues(preflight(StructurallyPruned(norm_dim), loader(x, x[:, :CLASSES].argmax(1)),
                             nn.CrossEntropyLoss())).get("PRUNING_MASK_OVER_INPUTS")
    assert (found is not None) == (norm_dim == 0)
    if found is not None:
        assert "weight.norm(dim=1, keepdim=True)" in found.fix


def two_views(x: torch.Tensor) -> DataLoader:
    g = torch.Generator().manual_seed(3)
    return loader(x + 0.05 * torch.randn(x.shape, generator=g), x + 0.05 * torch.randn(x.shape, generator=g))


@pytest.mark.parametrize("logits", ["distances", "negated_distances", "cosines"])
def test_infonce_logits_that_are_distances(logits):
    x = features()

    def info_nce(model, batch):
        z1, z2 = F.normalize(model(batch[0]), dim=1), F.normalize(model(batch[1]), dim=1)
        scores = {"distances": torch.cdist(z1, z2), "negated_distances": -torch.cdist(z1, z2),
                  "cosines": z1 @ z2.T}[logits] / 0.2
        return F.cross_entropy(scores, torch.arange(len(z1)))

    found = issues(preflight(mlp(8), two_views(x), info_nce)).get("CONTRASTIVE_LOGITS_ARE_DISTANCES")
    assert (found is not None) == (logits == "distances")
    if found is not None:
        assert "-torch.cdist(z1, z2) / t" in found.fix


@pytest.mark.parametrize("masked", [False, True], ids=["hardest_negative_unmasked", "same_class_masked"])
def test_batch_hard_mining_that_picks_the_anchor_itself(masked):
    x = features()
    labels = x[:, :CLASSES].argmax(1)

    def batch_hard(model, batch):
        inputs, y = batch
        e = F.normalize(model(inputs), dim=1)
        d = torch.cdist(e, e)
        same = y[:, None] == y[None, :]
        hardest_positive = d.masked_fill(~same, -1).max(1).values
        negatives = d.masked_fill(same, 1e3) if masked else d
        return F.relu(hardest_positive - negatives.min(1).values + 0.5).mean()

    found = issues(preflight(mlp(8), loader(x, labels), batch_hard)).get("NEGATIVE_IS_ANCHOR")
    assert (found is not None) == (not masked)
    if found is not None:
        assert "masked_fill(same_class" in found.fix


@pytest.mark.parametrize("labels", ["arange", "zeros"])
def test_moco_logits_with_the_positive_first_and_in_batch_labels(labels):
    x = features()
    queue = F.normalize(torch.randn(64, 8, generator=torch.Generator().manual_seed(5)), dim=1)

    def moco(model, batch):
        q, k = F.normalize(model(batch[0]), dim=1), F.normalize(model(batch[1]), dim=1).detach()
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.T], dim=1) / 0.2
        target = torch.arange(len(q)) if labels == "arange" else torch.zeros(len(q), dtype=torch.long)
        return F.cross_entropy(logits, target)

    found = issues(preflight(mlp(8), two_views(x), moco)).get("CONTRASTIVE_TARGET_NOT_POSITIVE")
    assert (found is not None) == (labels == "arange")
    if found is not None:
        assert "torch.zeros(32, dtype=torch.long)" in found.fix


@pytest.mark.parametrize("negatives", ["ones_like", "zeros_like"])
def test_sampled_negatives_given_the_positives_label(negatives):
    """Link prediction: scores of real pairs and of sampled pairs, concatenated, against labels
    concatenated alike; the negatives labelled 1 (ones_like copied) fire."""
    g = torch.Generator().manual_seed(6)
    pairs = torch.randint(0, 256, (256, 2), generator=g)

    class Embedder(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(256, 8)

        def forward(self, ids):
            return self.table(ids)

    def link_loss(model, batch):
        (p,) = batch
        sampled = torch.randint(0, 256, (len(p),))
        pos = (model(p[:, 0]) * model(p[:, 1])).sum(-1)
        neg = (model(p[:, 0]) * model(sampled)).sum(-1)
        labels = torch.cat([torch.ones_like(pos), getattr(torch, negatives)(neg)])
        return F.binary_cross_entropy_with_logits(torch.cat([pos, neg]), labels)

    found = issues(preflight(Embedder(), loader(pairs), link_loss)).get("TARGET_PARTS_ONE_LABEL")
    assert (found is not None) == (negatives == "ones_like")
    if found is not None:
        assert "32 + 32 rows" in found.message and "torch.zeros_like(neg_scores)" in found.fix


@pytest.mark.parametrize("dim", [0, 1])
def test_a_triplet_distance_reduced_over_the_batch(dim):
    x = features()
    g = torch.Generator().manual_seed(7)
    positives, negatives = x + 0.1 * torch.randn(x.shape, generator=g), torch.randn(x.shape, generator=g)

    def triplet(model, batch):
        a, p, n = (model(t) for t in batch)
        near, far = (a - p).pow(2).sum(dim), (a - n).pow(2).sum(dim)
        return F.relu(near - far + 1.0).mean()

    found = issues(preflight(mlp(8), loader(x, positives, negatives), triplet)).get("DISTANCE_OVER_BATCH")
    assert (found is not None) == (dim == 0)
    if found is not None:
        assert "(a - p).pow(2).sum(dim=1)" in found.fix and "(32, 8)" in found.message


def test_a_per_dimension_kl_averaged_over_the_batch_is_no_distance():
    """Free bits: the KL of each latent dimension averaged over the batch (mean(0)), then clamped."""
    x = features()

    def free_bits(model, batch):
        out = model(batch[0])
        mu, logvar = out[:, :4], out[:, 4:]
        kl_per_dim = (0.5 * (mu.pow(2) + logvar.exp() - logvar - 1)).mean(0)
        return F.mse_loss(mu, batch[0][:, :4]) + kl_per_dim.clamp(min=0.1).sum()

    assert "DISTANCE_OVER_BATCH" not in issues(preflight(mlp(8), loader(x), free_bits))


class MaskedLayerNet(nn.Module):
    def __init__(self, mask_as: str):
        super().__init__()
        torch.manual_seed(0)
        self.layer, self.head = nn.Linear(FEATURES, 32), nn.Linear(32, CLASSES)
        mask = (torch.arange(32)[:, None] % FEATURES >= torch.arange(FEATURES)[None, :]).float()
        if mask_as == "parameter":
            self.mask = nn.Parameter(mask)
        else:
            self.register_buffer("mask", mask)

    def forward(self, x):
        return self.head(torch.relu(F.linear(x, self.layer.weight * self.mask, self.layer.bias)))


@pytest.mark.parametrize("mask_as", ["parameter", "buffer"])
def test_a_connectivity_mask_registered_as_a_parameter(mask_as):
    x = features()
    found = issues(preflight(MaskedLayerNet(mask_as), loader(x, x[:, :CLASSES].argmax(1)),
                             nn.CrossEntropyLoss())).get("MASK_IS_PARAMETER")
    assert (found is not None) == (mask_as == "parameter")
    if found is not None:
        assert "register_buffer('mask'" in found.fix


@pytest.mark.parametrize("dim", [0, 1])
def test_a_mixture_likelihood_marginalised_over_the_batch(dim):
    """A mixture density network whose logsumexp runs over dim 0, the batch, instead of the components."""
    x = features()
    y = x[:, :1] * 2 + 0.1 * torch.randn(len(x), 1, generator=torch.Generator().manual_seed(3))

    def mdn_nll(model, batch):
        inputs, target = batch
        out = model(inputs)
        log_pi, mu, log_sigma = F.log_softmax(out[:, :4], 1), out[:, 4:8], out[:, 8:12]
        component = -0.5 * ((target - mu) / log_sigma.exp()) ** 2 - log_sigma
        return -torch.logsumexp(log_pi + component, dim=dim).mean()

    found = issues(preflight(mlp(12), loader(x, y), mdn_nll)).get("LOSS_NORM_DIM")
    assert (found is not None) == (dim == 0)
    if found is not None:
        assert "logsumexp over dim 0" in found.message and "dim=1" in found.fix


@pytest.mark.parametrize("given", ["weight", "pos_weight", "per_sample_weight"])
def test_an_imbalance_ratio_passed_as_weight_instead_of_pos_weight(given):
    x = features()
    y = (x[:, 0] > 1.0).float()[:, None]  # about 16% positives
    ratio = ((1 - y).sum() / y.sum()).reshape(1)
    criterion = {"weight": nn.BCEWithLogitsLoss(weight=ratio), "pos_weight": nn.BCEWithLogitsLoss(pos_weight=ratio),
                 "per_sample_weight": None}[given]

    def per_sample(model, batch):
        inputs, target = batch
        weights = 1 + target * (ratio - 1)  # positives weighted by the ratio: a rebalancing of its own
        return F.binary_cross_entropy_with_logits(model(inputs), target, weight=weights)

    found = issues(preflight(mlp(1), loader(x, y), criterion or per_sample)).get("BCE_WEIGHT_NOT_POS_WEIGHT")
    assert (found is not None) == (given == "weight")
    if found is not None:
        assert "pos_weight=torch.tensor(" in found.fix


@pytest.mark.parametrize("expand", ["repeat", "repeat_interleave"])
def test_quantile_targets_tiled_against_outputs_flattened_by_sample(expand):
    x = features()
    y = x[:, 0] * 2 + 1
    quantiles = torch.tensor([0.1, 0.5, 0.9])

    def pinball(model, batch):
        inputs, target = batch
        predictions = model(inputs).reshape(-1)  # (B, 3) row by row
        targets = getattr(target, expand)(3)
        error = targets - predictions
        q = quantiles.repeat(len(target))
        return torch.maximum(q * error, (q - 1) * error).mean()

    found = issues(preflight(mlp(3), loader(x, y), pinball)).get("TARGET_TILED")
    assert (found is not None) == (expand == "repeat")
    if found is not None:
        assert "y.repeat_interleave(3)" in found.fix and "(32, 3)" in found.message


def pinn_residual(column_source: bool):
    def loss_fn(model, batch):
        x = batch[0].clone().requires_grad_(True)
        u = model(x)
        (u_x,) = torch.autograd.grad(u.sum(), x, create_graph=True)
        (u_xx,) = torch.autograd.grad(u_x.sum(), x, create_graph=True)
        source = -torch.pi ** 2 * torch.sin(torch.pi * x[:, 0])  # (N,): computed from x, so in the graph too
        residual = u_xx - (source.unsqueeze(1) if column_source else source)
        return residual.pow(2).mean()
    return loss_fn


@pytest.mark.parametrize("column_source", [False, True])
def test_a_pde_residual_against_a_flat_source_term_broadcasts(column_source):
    x = torch.rand(256, 1, generator=torch.Generator().manual_seed(0)) * 2 - 1
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x), batch_size=32, shuffle=True), loss_fn=pinn_residual(column_source),
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    issues = [i for i in report.check("step.loss_function").issues if i.code == "LOSS_BROADCAST"]
    assert len(issues) == (0 if column_source else 1)
    if issues:
        assert "source or forcing term f(x)" in issues[0].message and "(32, 32)" in issues[0].message
        assert "f = f.unsqueeze(1)" in issues[0].fix


def ode_residual(order: str):
    def loss_fn(model, batch):
        t = batch[0].clone().requires_grad_(True)
        u = model(t)
        (u_t,) = torch.autograd.grad(u.sum(), t, create_graph=True)
        residual = u_t + 2.0 * u
        if order == "square_of_mean":
            return residual.mean().pow(2)
        if order == "variance":  # mean(r^2) - mean(r)^2 squares the mean on purpose
            return (residual ** 2).mean() - residual.mean() ** 2
        return residual.pow(2).mean()
    return loss_fn


@pytest.mark.parametrize("order", ["square_of_mean", "mean_of_squares", "variance"])
def test_a_residual_averaged_before_it_is_squared(order):
    t = torch.rand(256, 1, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(t), batch_size=32, shuffle=True), loss_fn=ode_residual(order),
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    issues = [i for i in report.check("step.loss_function").issues if i.code == "LOSS_SQUARES_MEAN"]
    assert len(issues) == (order == "square_of_mean")
    if issues:
        assert "(32, 1)" in issues[0].message and "(residual ** 2).mean()" in issues[0].fix
