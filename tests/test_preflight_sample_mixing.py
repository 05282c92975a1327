"""step.sample_mixing: a model whose outputs for one sample depend on the other samples of
the batch (the batch axis read as the sequence axis), caught even where the batch size
equals the sequence length and shapes cannot tell; independent samples stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.sample_mixing import SampleMixingCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

SIZE = 16  # the batch size and the sequence length: shapes alone cannot say which is which


class Encoder(nn.Module):
    def __init__(self, batch_first: bool, batchnorm: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(50, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.BatchNorm1d(32) if batchnorm else nn.Identity()
        self.head = nn.Linear(32, 4)

    def forward(self, ids):
        return self.head(self.norm(self.encoder(self.embed(ids)).mean(1)))


def mixing(model: nn.Module) -> list:
    ids = torch.randint(0, 50, (256, SIZE), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 4, (256,), generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(ids, labels), batch_size=SIZE, shuffle=True)
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3), loader, loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    result = report.check("step.sample_mixing")
    return [issue for issue in result.issues if issue.code == "BATCH_MIXING"], result


def test_a_batch_major_batch_into_a_sequence_first_encoder_mixes_the_samples():
    issues, result = mixing(Encoder(batch_first=False))
    assert issues and "batch_first=True" in issues[0].fix
    assert result.data["moved_share"] > 0.9


def test_independent_samples_are_quiet_with_dropout_and_batchnorm():
    issues, result = mixing(Encoder(batch_first=True, batchnorm=True))
    assert not issues
    assert 0 < result.data["moved_share"] <= 1 / SIZE + 1e-9  # only sample 0's outputs moved


def test_a_time_major_batch_cut_to_as_many_samples_as_positions_is_probed_along_its_batch_axis():
    # (T, B) = (16, 32) batches: cut to the first 16 samples, the time axis is as long as the batch
    # axis. Replacing "sample 0" along dim 0 changed time step 0 of every sample: a false mixing.
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed = nn.Embedding(50, 16)
            self.gru = nn.GRU(16, 16, batch_first=True)
            self.out = nn.Linear(16, 4)

        def forward(self, ids):
            return self.out(self.gru(self.embed(ids))[0])

    def time_major(rows):
        return torch.stack([row[0] for row in rows], 1), torch.stack([row[1] for row in rows], 1)

    def loss(model, batch):
        text, tags = batch
        logits = model(text.t())
        return nn.functional.cross_entropy(logits.reshape(-1, 4), tags.t().reshape(-1))

    ids = torch.randint(0, 50, (256, SIZE), generator=torch.Generator().manual_seed(0))
    tags = ids % 4
    loader = DataLoader(TensorDataset(ids, tags), batch_size=2 * SIZE, shuffle=True, collate_fn=time_major)
    model = Tagger()
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3), loader, loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    result = report.check("step.sample_mixing")
    assert not result.issues
    assert 0 < result.data["moved_share"] <= 1 / SIZE + 1e-9


class PaddedAttention(nn.Module):
    """One pre-built (B, T, T) key-padding mask per sample, tiled to (B*heads, T, T)."""

    def __init__(self, interleave: bool):
        super().__init__()
        torch.manual_seed(0)
        self.interleave, self.heads = interleave, 4
        self.embed = nn.Embedding(50, 32, padding_idx=0)
        self.attn = nn.MultiheadAttention(32, self.heads, batch_first=True)
        self.head = nn.Linear(32, 4)

    def forward(self, ids):
        B, T = ids.shape
        mask = (ids == 0)[:, None, :].expand(B, T, T)
        mask = mask.repeat_interleave(self.heads, 0) if self.interleave else mask.repeat(self.heads, 1, 1)
        h = self.embed(ids)
        return self.head((h + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0])[:, 0])


def padded_ids() -> torch.Tensor:
    ids = torch.randint(1, 50, (256, SIZE), generator=torch.Generator().manual_seed(0))
    lengths = torch.randint(4, SIZE, (256,), generator=torch.Generator().manual_seed(2))
    return ids.masked_fill(torch.arange(SIZE)[None, :] >= lengths[:, None], 0)


def mixing_padded(model: nn.Module) -> tuple[list, object]:
    labels = torch.randint(0, 4, (256,), generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(padded_ids(), labels), batch_size=32, shuffle=True)
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3), loader, loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    result = report.check("step.sample_mixing")
    return [issue for issue in result.issues if issue.code == "BATCH_MIXING"], result


def test_a_head_major_attention_mask_hands_samples_each_others_padding():
    # Only 3 of 16 samples move (those whose heads read sample 0's mask): far below the
    # "most of the output moved" of a batch axis read as time, caught per sample.
    issues, result = mixing_padded(PaddedAttention(interleave=False))
    assert issues, result.data
    assert result.data["other_samples_moved"] == [4, 8, 12]
    assert "repeat_interleave" in issues[0].message and "every 4th" in issues[0].message


def test_a_sample_major_attention_mask_is_quiet():
    issues, result = mixing_padded(PaddedAttention(interleave=True))
    assert not issues
    assert result.data["other_samples_moved"] == []


def test_the_sample_axis_of_an_output_is_the_one_where_only_sample_0_moved():
    from optimus_preflight.preflight.checks.sample_mixing import evenly_spaced, other_samples_moved
    first = torch.randn(16, 16, 8)  # (T, B, H) with T == B
    second = first.clone()
    second[:, 0] += 1.0  # sample 0 changed at every time step
    assert other_samples_moved([first], [second], 16) == []
    second[:, 5] += 1.0
    assert other_samples_moved([first], [second], 16) == [5]
    assert evenly_spaced([4, 8, 12], 16) == 4
    assert evenly_spaced([4, 8], 16) == 4  # sample 0's third part equal to sample 1's: that row stayed
    assert evenly_spaced([3, 5], 16) is None and evenly_spaced([2, 6], 16) is None  # 2 of 7 multiples: chance
    assert evenly_spaced([5, 10], 16) is None  # 5 does not divide the batch


class FieldEmbeddings(nn.Module):
    """One embedding per categorical field of a table, joined into each row's feature vector."""

    def __init__(self, joined_along_batch: bool):
        super().__init__()
        torch.manual_seed(0)
        self.joined_along_batch = joined_along_batch
        self.fields = nn.ModuleList(nn.Embedding(30, 8) for _ in range(4))
        self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, codes):
        parts = [embedding(codes[:, k]) for k, embedding in enumerate(self.fields)]
        if self.joined_along_batch:
            return self.head(torch.cat(parts, dim=0).view(codes.shape[0], -1))
        return self.head(torch.cat(parts, dim=1))


@pytest.mark.parametrize("joined_along_batch", [True, False])
def test_field_embeddings_joined_along_the_batch_are_named(joined_along_batch):
    codes = torch.randint(0, 30, (256, 4), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 2, (256,), generator=torch.Generator().manual_seed(1))
    model = FieldEmbeddings(joined_along_batch)
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(codes, labels), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    issues = [i for i in report.check("step.sample_mixing").issues if i.code == "BATCH_MIXING"]
    assert bool(issues) == joined_along_batch
    if issues:
        assert "every 4th" in issues[0].message and "torch.cat(parts, dim=0).view(B, -1)" in issues[0].message
        assert "torch.cat(parts, dim=1)" in issues[0].fix


class PositionalEncoded(nn.Module):
    """A batch_first encoder with the (max_len, 1, D) positional table of the seq-first tutorial."""

    def __init__(self, batch_axis_bug: bool):
        super().__init__()
        torch.manual_seed(0)
        self.bug = batch_axis_bug
        self.embed = nn.Embedding(50, 16)
        self.register_buffer("pe", torch.randn(64, 1, 16))
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(16, 4)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + (self.pe[:h.size(0)] if self.bug else self.pe[:h.size(1)].transpose(0, 1))
        return self.head(self.encoder(h).mean(1))


@pytest.mark.parametrize("bug", [True, False], ids=["pe_on_batch_axis", "pe_on_sequence_axis"])
def test_an_output_that_depends_on_the_batch_position(bug):
    ids = torch.randint(0, 50, (256, 12), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 4, (256,), generator=torch.Generator().manual_seed(1))
    model = PositionalEncoded(bug)
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids, labels), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    issues = [i for i in report.check("step.sample_mixing").issues if i.code == "BATCH_INDEX_DEPENDENT"]
    assert bool(issues) == bug
    if bug:
        assert "pe[:x.size(1)]" in issues[0].fix


def test_a_model_that_samples_noise_per_position_is_not_index_dependent():
    class Vae(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.enc, self.dec = nn.Linear(16, 8), nn.Linear(4, 16)

        def forward(self, x):
            mu, logvar = self.enc(x).chunk(2, dim=-1)
            return self.dec(mu + torch.randn_like(mu) * (0.5 * logvar).exp()), mu, logvar

    def loss(model, batch):
        recon, mu, logvar = model(batch[0])
        return nn.functional.mse_loss(recon, batch[0]) - 0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).mean()

    model = Vae()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(torch.randn(256, 16)), batch_size=32, shuffle=True), loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    assert not report.check("step.sample_mixing").issues


class Contour(nn.Module):
    """A pitch-contour classifier on (B, T, F) frames with delta features."""

    def __init__(self, delta_dim: int):
        super().__init__()
        torch.manual_seed(0)
        self.delta_dim = delta_dim
        self.head = nn.Linear(6, 3)

    def forward(self, frames):
        deltas = torch.diff(frames, dim=self.delta_dim, prepend=frames.narrow(self.delta_dim, 0, 1))
        summary = torch.cat([frames.mean(1), deltas.mean(1)], dim=1)
        return self.head(summary)


class ReversedSource(nn.Module):
    """A GRU encoder fed the source reversed, as seq2seq papers did."""

    def __init__(self, flip_dim: int):
        super().__init__()
        torch.manual_seed(0)
        self.flip_dim = flip_dim
        self.embed = nn.Embedding(50, 16)
        self.gru = nn.GRU(16, 16, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, ids):
        _, h = self.gru(self.embed(ids.flip(self.flip_dim)))
        return self.head(h[-1])


def mixing_frames(model: nn.Module) -> list:
    g = torch.Generator().manual_seed(0)
    frames, labels = torch.randn(256, 20, 3, generator=g), torch.randint(0, 3, (256,), generator=g)
    loader = DataLoader(TensorDataset(frames, labels), batch_size=32, shuffle=True)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    return [issue for issue in report.check("step.sample_mixing").issues if issue.code == "BATCH_MIXING"]


def test_deltas_taken_across_the_batch_read_the_previous_sample():
    issues = mixing_frames(Contour(delta_dim=0))
    assert len(issues) == 1 and "the sample before it" in issues[0].message
    assert "torch.diff(x, dim=1)" in issues[0].fix
    assert not mixing_frames(Contour(delta_dim=1))


def test_a_source_flipped_along_the_batch_axis_pairs_each_sample_with_its_mirror():
    issues, _ = mixing(ReversedSource(flip_dim=0))
    assert len(issues) == 1 and "reversed" in issues[0].message and "x.flip(1)" in issues[0].fix
    assert not mixing(ReversedSource(flip_dim=1))[0]


class DualEncoder(nn.Module):
    """Image and caption towers scored against every caption of the batch (CLIP)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.image = nn.Linear(12, 8)
        self.text = nn.EmbeddingBag(50, 8)
        self.logit_scale = nn.Parameter(torch.tensor(2.3))

    def forward(self, images, captions):
        a = nn.functional.normalize(self.image(images), dim=1)
        b = nn.functional.normalize(self.text(captions), dim=1)
        return self.logit_scale.exp() * a @ b.T


def test_scores_of_every_pair_of_samples_are_not_mixing():
    g = torch.Generator().manual_seed(0)
    images, captions = torch.randn(256, 12, generator=g), torch.randint(0, 50, (256, 6), generator=g)

    def clip_loss(model, batch):
        logits = model(*batch)
        targets = torch.arange(len(logits))
        return (nn.functional.cross_entropy(logits, targets) + nn.functional.cross_entropy(logits.T, targets)) / 2

    model = DualEncoder()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(images, captions), batch_size=32, shuffle=True), loss_fn=clip_loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    assert not report.check("step.sample_mixing").issues


class NeuralCf(nn.Module):
    def __init__(self, concat_dim: int | None):
        super().__init__()
        torch.manual_seed(0)
        self.user, self.item, self.concat_dim = nn.Embedding(50, 8), nn.Embedding(60, 8), concat_dim
        self.mlp = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, users, items):
        u, v = self.user(users), self.item(items)
        x = torch.cat((u, v)).view(-1, 16) if self.concat_dim is None else torch.cat((u, v), dim=self.concat_dim)
        return self.mlp(x).squeeze(-1)


@pytest.mark.parametrize("concat_dim", [None, 1], ids=["cat_default_dim_then_view", "cat_dim_1"])
def test_a_concatenation_along_the_batch_reshaped_to_fit_pairs_samples(concat_dim):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randint(0, 50, (256,), generator=g), torch.randint(0, 60, (256,), generator=g),
                         torch.randint(0, 2, (256,), generator=g).float())

    def bce(model, batch):
        users, items, liked = batch
        return nn.functional.binary_cross_entropy_with_logits(model(users, items), liked)

    model = NeuralCf(concat_dim)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=32, shuffle=True),
                           loss_fn=bce, checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    issues = report.check("step.sample_mixing").issues
    assert bool(issues) == (concat_dim is None)
    if issues:
        assert "torch.cat((u, v), dim=1)" in issues[0].fix


class HiddenStateClassifier(nn.Module):
    """A BiLSTM classifier reading its final states h_n (2, B, H)."""

    def __init__(self, flatten_with_view: bool):
        super().__init__()
        torch.manual_seed(0)
        self.flatten_with_view = flatten_with_view
        self.embed = nn.Embedding(50, 16)
        self.rnn = nn.LSTM(16, 12, batch_first=True, bidirectional=True)
        self.head = nn.Linear(24, 4)

    def forward(self, ids):
        _, (h_n, _) = self.rnn(self.embed(ids))
        if self.flatten_with_view:
            features = h_n.view(ids.size(0), -1)
        else:
            features = torch.cat([h_n[-2], h_n[-1]], dim=1)
        return self.head(features)


class BagAttention(nn.Module):
    """Attention pooling over a bag of 8 instances per sample (multiple-instance learning)."""

    def __init__(self, over_batch: bool):
        super().__init__()
        torch.manual_seed(0)
        self.over_batch = over_batch
        self.score = nn.Linear(6, 1)
        self.head = nn.Linear(6, 4)

    def forward(self, bags):  # (B, 8, 6)
        weights = torch.softmax(self.score(bags), dim=0 if self.over_batch else 1)
        return self.head((weights * bags).sum(1))


def _bags_mixing(model: nn.Module) -> list:
    bags = torch.randn(256, 8, 6, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 4, (256,), generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(bags, labels), batch_size=SIZE, shuffle=True)
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3), loader, loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    result = report.check("step.sample_mixing")
    return [issue for issue in result.issues if issue.code == "BATCH_MIXING"], result


def test_the_operation_that_mixes_is_named_with_its_line_a_view_of_h_n():
    issues, result = mixing(HiddenStateClassifier(flatten_with_view=True))
    assert issues, result.data
    message = issues[0].message
    assert "`view`" in message and "features = h_n.view(ids.size(0), -1)" in message
    assert "(2, 16, 12) tensor whose samples lie along axis 1" in message and "h_n" in issues[0].fix
    assert result.data["mixing_op"]["sample_axis"] == 1


def test_the_operation_that_mixes_is_named_a_softmax_over_the_batch():
    issues, result = _bags_mixing(BagAttention(over_batch=True))
    assert issues, result.data
    assert "`softmax(dim=0)`" in issues[0].message and "dim=0 if self.over_batch else 1" in issues[0].message
    assert "never the batch axis" in issues[0].fix


@pytest.mark.parametrize("model", [HiddenStateClassifier(flatten_with_view=False), BagAttention(over_batch=False)],
                         ids=["h_n_concatenated", "softmax_over_instances"])
def test_the_same_models_written_per_sample_are_quiet(model):
    issues, result = (mixing if isinstance(model, HiddenStateClassifier) else _bags_mixing)(model)
    assert not issues and "mixing_op" not in result.data


def test_the_first_mixing_call_is_none_where_no_call_confines_the_change():
    from optimus_preflight.preflight.analyses.mixing_op import Call, first_mixing

    base = torch.zeros(4, 3)
    changed = base.clone()
    changed[1] = 1.0  # another sample than 0 moved in the input already: no call is the first to mix
    first = [Call("relu", None, [base], [base], None)]
    second = [Call("relu", None, [changed], [changed], None)]
    assert first_mixing(first, second, keep=4) is None
    diverging = [Call("sigmoid", None, [base], [base], None)]
    assert first_mixing(first, diverging, keep=4) is None


class Sessions(torch.utils.data.Dataset):
    """Each sample a Python list of 10 item ids: default_collate gives 10 tensors of shape (B,)."""

    def __init__(self):
        g = torch.Generator().manual_seed(2)
        self.rows = ((torch.randint(0, 30, (256, 1), generator=g) + torch.arange(10)) % 30).tolist()

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return {"items": self.rows[index]}


class NextItem(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.gru, self.out = nn.Embedding(30, 16), nn.GRU(16, 32, batch_first=True), nn.Linear(32, 30)

    def forward(self, items):
        return self.out(self.gru(self.embed(items))[0])


@pytest.mark.parametrize("dim", [0, 1])
def test_a_list_collated_per_position_and_stacked_on_dim_0_is_named(dim):
    def loss(model, batch):
        sequences = torch.stack(batch["items"], dim=dim)
        logits = model(sequences[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, 30), sequences[:, 1:].reshape(-1))

    model = NextItem()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(Sessions(), batch_size=16, shuffle=True), loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    issues = [i for i in report.check("step.sample_mixing").issues if i.code == "BATCH_MIXING"]
    assert bool(issues) == (dim == 0)
    if issues:
        assert "default_collate" in issues[0].message and "torch.stack(batch['items'], dim=1)" in issues[0].fix


class RatingModel(nn.Module):
    """Matrix factorisation: a user-item dot product plus biases; the bug sums without a dim."""

    def __init__(self, per_row: bool):
        super().__init__()
        torch.manual_seed(0)
        self.per_row = per_row
        self.users, self.items = nn.Embedding(40, 8), nn.Embedding(60, 8)
        self.user_bias, self.item_bias = nn.Embedding(40, 1), nn.Embedding(60, 1)

    def forward(self, pairs):
        u, v = self.users(pairs[:, 0]), self.items(pairs[:, 1])
        dot = (u * v).sum(dim=1) if self.per_row else (u * v).sum()
        return dot + self.user_bias(pairs[:, 0]).squeeze(1) + self.item_bias(pairs[:, 1]).squeeze(1)


@pytest.mark.parametrize("per_row", [False, True], ids=["sum_without_dim", "sum_over_dim_1"])
def test_a_dot_product_summed_over_the_whole_batch_is_named(per_row):
    g = torch.Generator().manual_seed(0)
    pairs = torch.stack([torch.randint(0, 40, (512,), generator=g), torch.randint(0, 60, (512,), generator=g)], 1)
    ratings = torch.rand(512, generator=g) * 4 + 1
    model = RatingModel(per_row)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(pairs, ratings), batch_size=32, shuffle=True),
                           loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
                           checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    found = [i for i in report.check("step.sample_mixing").issues if i.code == "BATCH_MIXING"]
    assert bool(found) == (not per_row)
    if found:
        assert "sum() without a dim reduces the whole batch to one number" in found[0].message
        assert "(u * v).sum(dim=1)" in found[0].fix


class BatchStatistic(nn.Module):
    """Normalises over the batch axis even in eval mode: every sample reads the others."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(24, 16)

    def forward(self, x):
        h = self.layer(x)
        return h - h.mean(0, keepdim=True)


@pytest.mark.parametrize("mixes", [False, True], ids=["views_stacked_by_the_loss", "model_mixes_stacked_views"])
def test_views_stacked_by_the_loss_are_judged_by_the_models_own_rows(mixes):
    # SupCon / SimCLR: the loss feeds torch.cat([v1, v2]) (2B rows); a sample moves rows 0 and B.
    # An embedding width equal to the probe's 16 samples must not pass for the sample axis.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 24, generator=g)
    views = TensorDataset(x + 0.1 * torch.randn(256, 24, generator=g), x + 0.1 * torch.randn(256, 24, generator=g))
    model = BatchStatistic() if mixes else nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 16))

    def loss_fn(model, batch):
        z = nn.functional.normalize(model(torch.cat([batch[0], batch[1]])), dim=1)
        rows = len(z)
        scores = (z @ z.T / 0.1).masked_fill(torch.eye(rows, dtype=torch.bool), float("-inf"))
        return nn.functional.cross_entropy(scores, (torch.arange(rows) + rows // 2) % rows)

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(views, batch_size=SIZE, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    result = report.check("step.sample_mixing")
    assert bool([i for i in result.issues if i.code == "BATCH_MIXING"]) == mixes, result.data


class CentredPointNet(nn.Module):
    """(B, N, 3) point clouds centred, a shared per-point MLP, a max pool over the points."""

    def __init__(self, centre_dim: int):
        super().__init__()
        torch.manual_seed(0)
        self.centre_dim = centre_dim
        self.point, self.head = nn.Sequential(nn.Linear(3, 32), nn.ReLU()), nn.Linear(32, 3)

    def forward(self, points):
        points = points - points.mean(dim=self.centre_dim, keepdim=True)
        return self.head(self.point(points).amax(dim=1))


@pytest.mark.parametrize("centre_dim", [0, 1], ids=["over_the_batch", "over_each_clouds_points"])
def test_clouds_centred_with_a_mean_over_the_batch_name_the_mean(centre_dim):
    g = torch.Generator().manual_seed(1)
    clouds, labels = torch.randn(128, 64, 3, generator=g) + 5, torch.randint(0, 3, (128,), generator=g)
    model = CentredPointNet(centre_dim)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(clouds, labels), batch_size=16, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    found = [i for i in report.check("step.sample_mixing").issues if i.code == "BATCH_MIXING"]
    assert bool(found) == (centre_dim == 0)
    if found:
        assert "`mean(dim=0)`" in found[0].message and "runs over the samples of the batch" in found[0].message


class Quantised(nn.Module):
    """A VQ autoencoder of 16 features: samples that share a code decode alike, whatever their position."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder, self.decoder = nn.Linear(16, 4), nn.Linear(4, 16)
        self.codebook = nn.Parameter(torch.randn(1, 4))  # one code: every sample decodes alike

    def forward(self, x):
        ze = self.encoder(x)
        zq = self.codebook[torch.cdist(ze, self.codebook).argmin(1)]
        return self.decoder(ze + (zq - ze).detach()), ze


def test_outputs_as_wide_as_the_probe_are_not_read_as_positions():
    x = torch.randn(256, 16, generator=torch.Generator().manual_seed(0))
    model = Quantised()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x), batch_size=32, shuffle=True),
                           loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0])[0], b[0]),
                           checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    assert not report.check("step.first_step").issues
    assert report.check("step.sample_mixing").status.value == "passed", report.check("step.sample_mixing").data
