"""Label leakage: LM targets never shifted or a decoder fed its own targets (LEAK_TARGETS), attention that reads later
tokens under a next-token objective (LEAK_FUTURE), a feature column that is the label
(LEAK_FEATURE), a validation loader that reads training samples (LEAK_SPLIT).

Built as users get them wrong; the default char-LM, Hugging Face GPT-2/Llama (which take
labels=input_ids and shift inside), a BERT masked LM, an MLP and disjoint splits stay quiet.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset, random_split

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.feature_leak import FeatureLabelCheck, feature_label_matches
from optimus_preflight.preflight.checks.input_scale import InputScaleCheck
from optimus_preflight.preflight.checks.split_overlap import SplitOverlapCheck, sample_digest, subset_root
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.checks.target_leak import TargetLeakCheck, objective_of, probe_start
from optimus_preflight.preflight.framework import CheckStatus
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.recipes.char_lm import VOCAB_SIZE, CausalSelfAttention, CharTransformer, CharWindows
from tests.preflight_support import (
    CLASSES,
    FEATURES,
    assert_quiet,
    classification_data,
    codes,
    make_recipe,
    plain_context,
    run,
)

TARGETS = "step.target_leak"
FEATURE = "data.label_in_features"
SPLIT = "data.split_overlap"


# ------------------------------------------------------------- LM objectives
class BidirectionalAttention(CausalSelfAttention):
    """The char-LM's attention with is_causal forgotten."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time_, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        q, k, v = (t.view(batch, time_, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(batch, time_, channels))


def tiny_char_model(causal: bool = True) -> CharTransformer:
    torch.manual_seed(0)
    model = CharTransformer(VOCAB_SIZE, 32, n_layer=2, n_head=2, d_model=32, dropout=0.0)
    if not causal:
        for block in model.blocks:
            block.attn = BidirectionalAttention(32, 2, 0.0)
    return model


class UnshiftedWindows(CharWindows):
    """Targets that are the inputs themselves: the shift forgotten."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.tokens[index * self.block_size : (index + 1) * self.block_size].long()
        return chunk, chunk.clone()


def char_tokens() -> torch.Tensor:
    return torch.randint(1, VOCAB_SIZE, (4096,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)


def test_the_default_char_lm_is_a_causal_next_token_objective(tmp_path):
    recipe = make_recipe(tmp_path, classification=False)
    before = {key: value.clone() for key, value in recipe.model.state_dict().items()}
    was_training = recipe.model.training
    result = run(recipe, TargetLeakCheck)[TARGETS]
    assert_quiet(result)
    assert result.data["objective"] == "next_token" and result.data["shifted"] == 1.0
    assert result.data["change_before"] == 0.0 and result.data["change_at"] > 0
    after = recipe.model.state_dict()
    assert all(torch.equal(before[key], after[key]) for key in before)
    assert recipe.model.training == was_training  # the eval() of the probe is undone


def test_unshifted_lm_targets_fire_leak_targets(tmp_path):
    recipe = make_recipe(tmp_path, classification=False, dataset=UnshiftedWindows(char_tokens(), 32))
    result = run(recipe, TargetLeakCheck)[TARGETS]
    assert codes(result) == {"LEAK_TARGETS"} and result.status == CheckStatus.ERROR
    assert "copy" in result.issues[0].message and "ids[:, 1:]" in result.issues[0].fix
    assert result.data["aligned"] == 1.0


def test_a_char_lm_without_a_causal_mask_fires_leak_future(tmp_path):
    recipe = make_recipe(tmp_path, classification=False, model=lambda: tiny_char_model(causal=False))
    result = run(recipe, TargetLeakCheck)[TARGETS]
    assert codes(result) == {"LEAK_FUTURE"} and result.status == CheckStatus.ERROR
    assert result.data["change_before"] > 1e-3 * result.data["change_at"]
    assert "is_causal=True" in result.issues[0].fix


class TorchDecoderLM(nn.Module):
    """A next-token model on nn.TransformerDecoder (self-attention over the tokens, a memory of one
    learned vector), with or without the causal tgt_mask."""

    def __init__(self, causal: bool):
        super().__init__()
        torch.manual_seed(0)
        self.causal = causal
        self.embed, self.pos = nn.Embedding(30, 32), nn.Embedding(16, 32)
        self.memory = nn.Parameter(torch.randn(1, 1, 32))
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(32, 4, 64, dropout=0.0, batch_first=True), 1)
        self.out = nn.Linear(32, 30)

    def forward(self, ids):
        steps = ids.shape[1]
        h = self.embed(ids) + self.pos(torch.arange(steps, device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(steps, device=ids.device) if self.causal else None
        return self.out(self.decoder(h, self.memory.expand(len(ids), -1, -1), tgt_mask=mask))


@pytest.mark.parametrize("causal", [False, True])
def test_a_torch_decoder_without_tgt_mask_is_named(causal):
    ids = torch.randint(1, 30, (256, 13), generator=torch.Generator().manual_seed(0))
    model = TorchDecoderLM(causal)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=32),
                           loss_fn=lambda m, b: F.cross_entropy(m(b[0]).reshape(-1, 30), b[1].reshape(-1)),
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetLeakCheck()])
    issues = [i for i in report.check(TARGETS).issues if i.code == "LEAK_FUTURE"]
    assert bool(issues) == (not causal)
    if issues:
        assert "its tgt_mask was left out" in issues[0].message
        assert "tgt_mask=nn.Transformer.generate_square_subsequent_mask" in issues[0].fix


def test_a_classifier_has_no_token_objective(tmp_path):
    result = run(plain_context(tmp_path), TargetLeakCheck)[TARGETS]
    assert_quiet(result)
    assert result.data["summary"] == "no token embedding in the model"


def test_objectives_from_targets():
    ids = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(0))
    assert objective_of(ids, ids.flatten(), -100).kind == "copy"
    assert objective_of(ids[:, :-1], ids[:, 1:].flatten(), -100).kind == "next_token"
    # Hugging Face: labels padded with ignore_index, shifted, flattened to B * T.
    hf = F.pad(ids, (0, 1), value=-100)[:, 1:].flatten()
    assert objective_of(ids, hf, -100).kind == "next_token"
    # Logits of the first T - 1 positions against labels[:, 1:] (the older HF layout).
    assert objective_of(ids, ids[:, 1:].flatten(), -100).kind == "next_token"
    masked = torch.full_like(ids, -100)
    masked[:, ::3] = ids[:, ::3]
    inputs = ids.clone()
    inputs[:, ::3] = 99  # [MASK]
    assert objective_of(inputs, masked.flatten(), -100).kind == "other"
    assert objective_of(ids, torch.zeros(4), -100) is None  # a target per sample, not per token


def test_the_probe_skips_a_prefix_the_loss_ignores():
    grid = torch.arange(32).view(2, 16)
    grid[:, :10] = -100  # a prompt (or a prefix-LM's bidirectional part) without targets
    grid[1, :12] = -100
    start, rows = probe_start(grid, -100)
    assert start == 13 and rows.tolist() == [True, True]
    start, rows = probe_start(grid[:, :12], -100)
    assert start == 11 and rows.tolist() == [True, False]  # only the row trained there is compared
    assert probe_start(torch.full((2, 4), -100), -100) is None


# ---------------------------------------------------------- Hugging Face models
@pytest.fixture
def transformers():
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    return transformers


HF_VOCAB = 97


class TokenData(Dataset):
    """{"input_ids", "labels"} samples: labels = input_ids (as HF causal LMs take them),
    or BERT-style masking of every fourth token."""

    def __init__(self, masked: bool = False, samples: int = 32, length: int = 16, shifted: bool = False):
        self.ids = torch.randint(5, HF_VOCAB, (samples, length), generator=torch.Generator().manual_seed(0))
        self.masked = masked
        self.shifted = shifted  # labels shifted by hand, as for a model that does not shift itself

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.ids[index]
        if self.shifted:
            return {"input_ids": ids, "labels": torch.cat([ids[1:], torch.tensor([-100])])}
        if not self.masked:
            return {"input_ids": ids, "labels": ids.clone()}
        chosen = torch.zeros_like(ids, dtype=torch.bool)
        chosen[::4] = True
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        return {"input_ids": torch.where(chosen, torch.full_like(ids, 4), ids), "labels": labels}


def leak_check(model: nn.Module, data: Dataset):
    loader = DataLoader(data, batch_size=8, shuffle=True)
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), lr=1e-3), loader,
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetLeakCheck()])
    return next(result for result in report.checks if result.name == TARGETS)


def bert_config(transformers, **extra):
    return transformers.BertConfig(vocab_size=HF_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=64, **extra)


def test_hf_causal_lms_shift_labels_inside_and_are_quiet(transformers):
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=HF_VOCAB, n_positions=32, n_embd=32,
                                                                n_layer=2, n_head=2))
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=HF_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64))
    for model in (gpt2, llama):
        result = leak_check(model, TokenData())
        assert_quiet(result)
        assert result.data["objective"] == "next_token" and result.data["change_before"] == 0.0


def test_labels_shifted_by_hand_into_a_hf_causal_lm_fire_shift_twice(transformers):
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=HF_VOCAB, n_positions=32, n_embd=32,
                                                                n_layer=2, n_head=2))
    result = leak_check(gpt2, TokenData(shifted=True))
    assert codes(result) == {"LM_SHIFT_TWICE"} and result.status == CheckStatus.ERROR
    assert "labels=input_ids" in result.issues[0].fix and result.data["objective"] == "shifted_twice"


def test_targets_two_tokens_ahead_in_a_hand_written_loss_fire_shift_twice(tmp_path):
    class TwiceShifted(CharWindows):
        def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            chunk = self.tokens[index * self.block_size : (index + 1) * self.block_size + 2].long()
            return chunk[:-2], chunk[2:]

    recipe = make_recipe(tmp_path, classification=False, dataset=TwiceShifted(char_tokens(), 32))
    result = run(recipe, TargetLeakCheck)[TARGETS]
    assert codes(result) == {"LM_SHIFT_TWICE"}
    assert "ids[:, 1:]" in result.issues[0].fix


def test_a_bert_masked_lm_is_quiet(transformers):
    result = leak_check(transformers.BertForMaskedLM(bert_config(transformers)), TokenData(masked=True))
    assert_quiet(result)
    assert "neither" in result.data["summary"]


def test_a_bert_trained_on_unmasked_labels_copies_its_input(transformers):
    result = leak_check(transformers.BertForMaskedLM(bert_config(transformers)), TokenData())
    assert codes(result) == {"LEAK_TARGETS"}


def test_a_bert_lm_head_that_is_no_decoder_sees_the_future(transformers):
    leaky = leak_check(transformers.BertLMHeadModel(bert_config(transformers)), TokenData())
    assert codes(leaky) == {"LEAK_FUTURE"}
    assert_quiet(leak_check(transformers.BertLMHeadModel(bert_config(transformers, is_decoder=True)), TokenData()))


class GruSeq2Seq(nn.Module):
    """Encoder and decoder share one embedding table, as many tutorial seq2seq models do: the
    decoder's ids reach it in its second call."""

    def __init__(self, vocab: int = 20):
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        self.encoder = nn.GRU(16, 16, batch_first=True)
        self.decoder = nn.GRU(16, 16, batch_first=True)
        self.out = nn.Linear(16, vocab)

    def forward(self, source: torch.Tensor, decoder_input: torch.Tensor) -> torch.Tensor:
        _, state = self.encoder(self.embed(source))
        hidden, _ = self.decoder(self.embed(decoder_input), state)
        return self.out(hidden)


@pytest.mark.parametrize("shift_right", [False, True])
def test_a_teacher_forced_decoder_given_its_own_targets_fires_leak_targets(shift_right):
    source = torch.randint(2, 20, (64, 10), generator=torch.Generator().manual_seed(0))
    target = source.flip(1)  # a reversal task: the targets are not the source tokens

    def loss_fn(model, batch):
        src, tgt = batch
        # The bug: the decoder reads tgt itself; teacher forcing feeds it tgt shifted right.
        decoder_input = torch.cat([torch.ones_like(tgt[:, :1]), tgt[:, :-1]], dim=1) if shift_right else tgt
        return F.cross_entropy(model(src, decoder_input).reshape(-1, 20), tgt.reshape(-1))

    model = GruSeq2Seq()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), lr=1e-3),
                           DataLoader(TensorDataset(source, target), batch_size=16, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetLeakCheck()])
    result = next(result for result in report.checks if result.name == TARGETS)
    if shift_right:
        assert_quiet(result)
        assert result.data["objective"] == "next_token" and result.data["embedding_call"] == 1
        assert result.data["change_before"] == 0.0  # a GRU decoder is causal
    else:
        assert codes(result) == {"LEAK_TARGETS"} and result.data["embedding_call"] == 1
        assert "decoder" in result.issues[0].message and "shifted right" in result.issues[0].fix


class Seq2SeqData(Dataset):
    """A reversal task for a Hugging Face encoder-decoder; ``decoder_input_ids=labels`` is the
    bug of passing the labels as the decoder's input too."""

    def __init__(self, decoder_inputs: bool):
        self.ids = torch.randint(5, HF_VOCAB, (32, 12), generator=torch.Generator().manual_seed(0))
        self.decoder_inputs = decoder_inputs

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        labels = self.ids[index].flip(0)
        sample = {"input_ids": self.ids[index], "labels": labels}
        if self.decoder_inputs:
            sample["decoder_input_ids"] = labels.clone()
        return sample


def test_a_t5_given_its_labels_as_decoder_input_ids_fires_and_labels_alone_are_quiet(transformers):
    def t5():
        torch.manual_seed(0)
        return transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=HF_VOCAB, d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16, decoder_start_token_id=0,
            pad_token_id=0))

    leaky = leak_check(t5(), Seq2SeqData(decoder_inputs=True))
    assert codes(leaky) == {"LEAK_TARGETS"} and "not decoder_input_ids=labels" in leaky.issues[0].fix
    healthy = leak_check(t5(), Seq2SeqData(decoder_inputs=False))
    assert_quiet(healthy)
    assert healthy.data["objective"] == "next_token" and healthy.data["change_before"] == 0.0


# ------------------------------------------------------------ label in features
def leaky_features(extra: torch.Tensor, samples: int = 64) -> TensorDataset:
    data = classification_data(samples)
    features, labels = data.tensors
    return TensorDataset(torch.cat([features, extra(labels)], dim=1), labels)


@pytest.mark.parametrize(("column", "kind"), [
    (lambda y: y.float()[:, None], "equals the label"),
    (lambda y: ((y.float() - 1.5) / 1.1)[:, None], "relabelling"),  # the label standardised with the features
    (lambda y: F.one_hot(y, CLASSES).float(), "one-hot"),
])
def test_a_feature_column_that_is_the_label_fires_leak_feature(tmp_path, column, kind):
    ctx = plain_context(tmp_path, dataset=leaky_features(column))
    result = run(ctx, FeatureLabelCheck)[FEATURE]
    assert codes(result) == {"LEAK_FEATURE"} and result.status == CheckStatus.WARNING
    assert kind in result.issues[0].message
    assert "drop" in result.issues[0].fix


def test_a_regression_target_among_the_features_fires(tmp_path):
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(64, FEATURES, generator=generator)
    target = features @ torch.randn(FEATURES, generator=generator)
    leaked = torch.cat([features, (3 * target + 1)[:, None]], dim=1)
    matches = feature_label_matches(leaked, target)
    assert [(m.columns, m.kind) for m in matches] == [([FEATURES], "affine")]
    assert feature_label_matches(features, target) == []


@pytest.mark.parametrize("cut_too_long", [True, False])
def test_a_forecasting_window_that_holds_its_own_target_fires(cut_too_long):
    series = torch.cumsum(torch.randn(3000, generator=torch.Generator().manual_seed(0)), 0) * 0.1
    width = 24
    extra = 1 if cut_too_long else 0
    windows = torch.stack([series[i : i + width + extra] for i in range(1000)]).unsqueeze(-1)  # (B, T, 1)
    targets = torch.stack([series[i + width] for i in range(1000)]).unsqueeze(-1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(width + extra, 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(windows, targets), batch_size=32, shuffle=True),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), FeatureLabelCheck()])
    result = report.check(FEATURE)
    if cut_too_long:
        assert codes(result) == {"LEAK_FEATURE"}
        assert "step 24 of feature 0" in result.issues[0].message and "cut one step too long" in result.issues[0].message
        assert "series[i : i + W]" in result.issues[0].fix and "shift(-1)" in result.issues[0].fix
    else:
        assert_quiet(result)


def test_a_flat_window_whose_target_is_its_last_value_is_named_an_echo():
    """(B, T) windows without a feature axis, the target taken at i + window - 1 (inside)."""
    series = torch.cumsum(torch.randn(3000, generator=torch.Generator().manual_seed(0)), 0) * 0.1
    width = 16
    windows = torch.stack([series[i : i + width] for i in range(1000)])
    last = torch.stack([series[i + width - 1] for i in range(1000)]).unsqueeze(-1)
    model = nn.Linear(width, 1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(windows, last), batch_size=32, shuffle=True),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), FeatureLabelCheck()])
    issue = report.check(FEATURE).issues[0]
    assert "the last value of each 16-step window" in issue.message and "series[i + 16 - 1]" in issue.message


def test_a_target_shifted_into_the_past_is_named_as_shifted_the_wrong_way():
    series = torch.cumsum(torch.randn(3000, generator=torch.Generator().manual_seed(0)), 0) * 0.1
    width = 24
    windows = torch.stack([series[i : i + width] for i in range(1, 1001)]).unsqueeze(-1)
    previous = torch.stack([series[i + width - 2] for i in range(1, 1001)]).unsqueeze(-1)  # shift(1): inside
    model = nn.Sequential(nn.Flatten(), nn.Linear(width, 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(windows, previous), batch_size=32, shuffle=True),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), FeatureLabelCheck()])
    issue = report.check(FEATURE).issues[0]
    assert "step 22 of feature 0" in issue.message and "shift(1), the previous step" in issue.message


def test_binary_float_labels_of_shape_n_1_are_read_too(tmp_path):
    data = classification_data()
    features, labels = data.tensors
    binary = (labels % 2).float()[:, None]  # BCEWithLogitsLoss targets
    model = nn.Linear(FEATURES + 1, 1)

    def bce(module, batch):
        return F.binary_cross_entropy_with_logits(module(batch[0]), batch[1])

    ctx = plain_context(tmp_path, model=lambda: model, loss=bce,
                         dataset=TensorDataset(torch.cat([features, binary], dim=1), binary))
    assert codes(run(ctx, FeatureLabelCheck)[FEATURE]) == {"LEAK_FEATURE"}


def test_a_toy_regression_on_one_feature_is_not_a_leak(tmp_path):
    inputs = torch.linspace(-1, 1, 64)[:, None]
    model = nn.Linear(1, 1)

    def mse(module, batch):
        return F.mse_loss(module(batch[0]), batch[1])

    ctx = plain_context(tmp_path, model=lambda: model, loss=mse, dataset=TensorDataset(inputs, 2 * inputs + 1))
    assert_quiet(run(ctx, FeatureLabelCheck)[FEATURE])


def test_healthy_and_coincidental_features_stay_quiet(tmp_path):
    assert_quiet(run(plain_context(tmp_path), FeatureLabelCheck)[FEATURE])
    generator = torch.Generator().manual_seed(0)
    # Many binary features over a batch of 16 balanced binary labels: one may line up with
    # the labels by chance, so nothing is claimed.
    words = (torch.rand(16, 300, generator=generator) < 0.5).float()
    labels = torch.tensor([0, 1] * 8)
    words[:, 7] = labels.float()
    assert feature_label_matches(words, labels) == []
    # A class seen once can be matched by any column that singles out its row.
    assert feature_label_matches(torch.eye(10), torch.arange(10)) == []


# ---------------------------------------------------------------- split overlap
def split_check(train: Dataset, val: Dataset | None, **kwargs):
    model = nn.Linear(FEATURES, CLASSES)
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           DataLoader(train, batch_size=16, shuffle=True),
                           val_loader=DataLoader(val, batch_size=16) if val is not None else None,
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitOverlapCheck()], **kwargs)
    return next(result for result in report.checks if result.name == SPLIT)


def test_the_default_recipes_split_is_quiet(tmp_path):
    recipe = make_recipe(tmp_path, classification=False)
    assert recipe.val_loader is not None
    result = run(recipe, SplitOverlapCheck)[SPLIT]
    assert_quiet(result)
    # Python sources repeat a few 32-character windows; that is not a leaked split.
    assert result.data["validation_read"] > 0 and result.data["estimated_share"] < 0.25


def test_a_validation_loader_on_the_training_set_fires(tmp_path):
    data = classification_data()
    result = split_check(data, data)
    assert codes(result) == {"LEAK_SPLIT"} and result.status == CheckStatus.WARNING
    assert "reads the training dataset itself" in result.issues[0].message
    assert result.issues[0].fix.startswith("For the datasets of the DataLoaders you train with, split once")


def test_two_random_splits_with_different_seeds_overlap(tmp_path):
    data = classification_data(100)
    train, _ = random_split(data, [0.8, 0.2], generator=torch.Generator().manual_seed(0))
    _, val = random_split(data, [0.8, 0.2], generator=torch.Generator().manual_seed(1))
    shared = len(set(train.indices) & set(val.indices))
    result = split_check(train, val)
    assert codes(result) == {"LEAK_SPLIT"}
    assert result.data["shared"] == shared and result.data["exact"]
    assert f"{shared} of its 20 samples" in result.issues[0].message


def test_one_random_split_is_quiet():
    train, val = random_split(classification_data(100), [0.8, 0.2], generator=torch.Generator().manual_seed(0))
    result = split_check(train, val)
    assert_quiet(result)
    assert result.data["shared"] == 0


def test_a_validation_set_rebuilt_from_training_samples_fires():
    data = classification_data(96)
    features, labels = data.tensors
    # Another dataset object over the last 48 training samples (an overlapping file list).
    val = TensorDataset(features[48:].clone(), labels[48:].clone())
    result = split_check(data, val)
    assert codes(result) == {"LEAK_SPLIT"} and not result.data["exact"]
    assert result.data["shared"] == 48


def test_separate_data_is_quiet():
    result = split_check(classification_data(seed=0), classification_data(seed=1))
    assert_quiet(result)
    assert result.data["shared"] == 0 and result.data["training_read"] == 64


def test_no_validation_loader_or_an_iterable_one_is_not_compared():
    assert split_check(classification_data(), None).data["summary"] == "no validation loader"

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(classification_data())

    assert "not compared" in split_check(classification_data(), Stream()).data["summary"]


class HangsAfterFirst(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int):
        if index > 0:
            time.sleep(60)
        return torch.zeros(FEATURES), torch.tensor(0)


def test_a_hanging_validation_dataset_is_reported_not_waited_for():
    started = time.perf_counter()
    result = split_check(classification_data(), HangsAfterFirst(), first_batch_timeout_s=1.0)
    assert codes(result) == {"DATA_TIMEOUT"}
    assert time.perf_counter() - started < 30


def test_subsets_and_digests():
    data = classification_data(10)
    inner = torch.utils.data.Subset(torch.utils.data.Subset(data, [9, 8, 7, 6]), [1, 3])
    assert subset_root(inner) == (data, [8, 6])
    assert sample_digest(data[3]) == sample_digest((data[3][0].clone(), data[3][1].clone()))
    assert sample_digest(data[3]) != sample_digest(data[4])
    assert sample_digest(torch.zeros(2)) != sample_digest(torch.zeros(2, dtype=torch.float64))


def test_a_recipe_is_pointed_at_data_val(tmp_path):
    recipe = make_recipe(tmp_path, classification=False)
    ctx = PreflightContext.from_recipe(recipe)
    ctx.val_loader = DataLoader(recipe.train_loader.dataset, batch_size=4)
    result = run(ctx, SplitOverlapCheck)[SPLIT]
    assert codes(result) == {"LEAK_SPLIT"} and result.issues[0].config_key == "data.val"


def test_plain_loops_of_an_mlp_and_a_cnn_are_quiet():
    generator = torch.Generator().manual_seed(0)
    images = (torch.rand(64, 3, 16, 16, generator=generator) - 0.45) / 0.25
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, CLASSES))
    mlp = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))
    image_data = TensorDataset(images, torch.randint(0, CLASSES, (64,), generator=generator))
    for model, data in ((mlp, classification_data(100)), (cnn, image_data)):
        train, val = random_split(data, [0.8, 0.2], generator=torch.Generator().manual_seed(0))
        report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1),
                               DataLoader(train, batch_size=16, shuffle=True), val_loader=DataLoader(val, batch_size=16),
                               loss_fn=nn.CrossEntropyLoss(),
                               checks=[FirstBatchCheck(), InputScaleCheck(), FeatureLabelCheck(), SplitOverlapCheck(),
                                       FirstStepCheck(), TargetLeakCheck()])
        assert report.status == "passed", [(r.name, r.issues) for r in report.checks]


def test_a_validation_loader_on_the_whole_dataset_reads_every_training_subset_sample():
    data = classification_data(100)
    train, _ = random_split(data, [0.8, 0.2], generator=torch.Generator().manual_seed(0))
    result = split_check(train, data)
    assert codes(result) == {"LEAK_SPLIT"}
    assert result.data["shared"] == 80 and result.data["validation_samples"] == 100


def _groups(rows: int = 256, groups: int = 120, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    group = torch.randint(0, groups, (rows,), generator=g)
    effect = torch.randn(groups, generator=g)
    x = torch.randn(rows, 4, generator=g)
    score = x[:, 0] + effect[group] + 0.5 * torch.randn(rows, generator=g)
    return group, x, score


def _group_mean(group, values, leave_one_out: bool):
    sums = torch.zeros(int(group.max()) + 1).index_add_(0, group, values)
    counts = torch.zeros(int(group.max()) + 1).index_add_(0, group, torch.ones(len(group)))
    if leave_one_out:
        others = (counts[group] - 1).clamp_min(1)
        return torch.where(counts[group] > 1, (sums[group] - values) / others, values.mean())
    return sums[group] / counts[group]


@pytest.mark.parametrize("kind", ["binary", "continuous"])
@pytest.mark.parametrize("leave_one_out", [False, True])
def test_a_target_encoding_that_includes_the_row_fires(kind, leave_one_out):
    from optimus_preflight.preflight.checks.feature_leak import own_label_encoded

    group, x, score = _groups()
    labels = (score > 0).float() if kind == "binary" else score
    encoded = torch.cat([x, _group_mean(group, labels, leave_one_out)[:, None]], dim=1)
    found = own_label_encoded(encoded[:64], labels[:64])
    assert (found is not None) == (not leave_one_out)
    if found is not None:
        assert found[0] == 4
    binary_feature = torch.cat([x, (x[:, :1] > 0).float()], dim=1)  # predictive, but a feature of its own
    assert own_label_encoded(binary_feature[:64], (score[:64] > 0).float()) is None


@pytest.mark.parametrize("val_shifted", [False, True], ids=["val_targets_unshifted", "val_like_training"])
def test_validation_pairs_built_unlike_the_training_ones_fire(val_shifted):
    ids = torch.randint(1, 30, (256, 13), generator=torch.Generator().manual_seed(0))
    model = TorchDecoderLM(causal=True)
    val = TensorDataset(ids[:64, :-1], ids[:64, 1:] if val_shifted else ids[:64, :-1])
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=32),
                           val_loader=DataLoader(val, batch_size=32),
                           loss_fn=lambda m, b: F.cross_entropy(m(b[0]).reshape(-1, 30), b[1].reshape(-1)),
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetLeakCheck()])
    issues = [i for i in report.check(TARGETS).issues if i.code == "VAL_TARGETS_NOT_SHIFTED"]
    assert bool(issues) == (not val_shifted), report.check(TARGETS).issues
    if issues:
        assert "same position" in issues[0].message and "targets = ids[1:]" in issues[0].fix


class TinySeq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.pos = nn.Embedding(30, 32), nn.Embedding(16, 32)
        self.transformer = nn.Transformer(32, 4, 1, 1, 64, dropout=0.0, batch_first=True)
        self.out = nn.Linear(32, 30)

    def forward(self, src, tgt_in):
        def embed(ids):
            return self.embed(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1], device=tgt_in.device)
        return self.out(self.transformer(embed(src), embed(tgt_in), tgt_mask=mask, tgt_is_causal=True))


def test_a_seq2seq_whose_encoder_is_given_the_decoder_input_is_named():
    src = torch.randint(3, 30, (256, 8), generator=torch.Generator().manual_seed(0))
    tgt = src.flip(1)
    model = TinySeq2Seq()

    def loss_fn(model, batch):
        source, target = batch
        target_in = torch.cat([torch.ones_like(target[:, :1]), target[:, :-1]], 1)
        return F.cross_entropy(model(target_in, target_in).reshape(-1, 30), target.reshape(-1))

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(src, tgt), batch_size=32), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetLeakCheck()])
    issues = [i for i in report.check(TARGETS).issues if i.code == "LEAK_FUTURE"]
    assert issues and "the encoder is given the decoder's input" in issues[0].message
    assert "tgt_mask was left out" not in issues[0].message and "model(src, tgt_in)" in issues[0].fix


def test_a_decoder_input_padded_with_the_pad_id_is_still_the_shifted_targets():
    # labels: answer + EOS, then -100; decoder input: BOS + labels[:-1], padded with the pad id 0
    # (not with the EOS it would be shifted from): the row's last target meets padding next.
    g = torch.Generator().manual_seed(0)
    labels = torch.full((4, 8), -100)
    decoder_input = torch.zeros(4, 8, dtype=torch.long)
    for row, length in enumerate([3, 5, 6, 7]):
        answer = torch.cat([torch.randint(3, 50, (length,), generator=g), torch.tensor([2])])
        labels[row, :length + 1] = answer
        decoder_input[row, 0], decoder_input[row, 1:length + 1] = 1, answer[:-1]
    assert objective_of(decoder_input, labels.flatten(), -100).kind == "next_token"


@pytest.mark.parametrize("start", [23, 24], ids=["inside_the_window", "after_the_window"])
def test_horizon_targets_cut_one_step_early_repeat_the_last_input(start):
    series = torch.sin(torch.arange(600) / 7.0) + 0.1 * torch.randn(600, generator=torch.Generator().manual_seed(0))
    starts = range(0, 560)
    x = torch.stack([series[i:i + 24] for i in starts])
    y = torch.stack([series[i + start:i + start + 6] for i in starts])
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 6))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), loss_fn=nn.MSELoss(),
                           checks=[FirstBatchCheck(), FeatureLabelCheck()])
    issues = report.check("data.label_in_features").issues
    assert [i.code for i in issues] == (["LEAK_FEATURE"] if start == 23 else [])
    if issues:
        assert "off by one" in issues[0].message and "y = series[i + W : i + W + H]" in issues[0].fix
