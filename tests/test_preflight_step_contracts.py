"""Contracts of the user's own step the toolkit cannot enforce: padding reaching the loss
(O15), a loss already divided by the accumulation steps or summed (O9), and a step that
leaves the model in eval mode (O5). Each fires on the way users really get it wrong and
stays quiet on the healthy setups (char-LM, MLP, CNN, Hugging Face GPT-2/Llama/BERT)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.padding import as_rows, edge_padding, sequence_shapes
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.model_checks import ModesCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, PaddedLossCheck
from optimus_preflight.preflight.checks.step_runs import AccumulationCheck, LossScaleCheck
from optimus_preflight.preflight.framework import CheckStatus, Severity
from tests.preflight_support import CLASSES, FEATURES, assert_quiet, classifier, codes, make_recipe, plain_context, run
from tests.step_helpers import make_runner, window

CONTRACT_CHECKS = (FirstStepCheck, PaddedLossCheck, LossScaleCheck)
VOCAB, PAD, LENGTH = 12, 0, 12


# ------------------------------------------------------------------- helpers
class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, ids):
        return self.head(self.drop(self.embed(ids)))


def padded_tokens(samples: int = 64, side: str = "end", pad_target: int = PAD) -> TensorDataset:
    """Token rows of 4..LENGTH+1 real ids (1..VOCAB-1), padded with PAD to LENGTH+1;
    inputs are ids[:-1], targets ids[1:] with padding targets set to ``pad_target``."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (samples, LENGTH + 1), generator=generator)
    lengths = torch.randint(4, LENGTH + 2, (samples,), generator=generator)
    positions = torch.arange(LENGTH + 1)
    padding = positions >= lengths[:, None] if side == "end" else positions < (LENGTH + 1 - lengths[:, None])
    ids[padding] = PAD
    targets = ids[:, 1:].clone()
    targets[padding[:, 1:]] = pad_target
    return TensorDataset(ids[:, :-1], targets)


def _token_ce(model, batch, **kwargs):
    inputs, targets = batch
    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten(), **kwargs)


def _lm_recipe(tmp_path, loss, dataset=None, *overrides):
    return plain_context(tmp_path, *overrides, model=TinyLM, loss=loss, dataset=dataset if dataset is not None else padded_tokens())


def _loud(result):
    return [issue for issue in result.issues if issue.severity != Severity.INFO]


# ------------------------------------------------------- O15 padded-token loss
@pytest.mark.parametrize("side", ["end", "start"])
def test_a_mean_over_padding_without_ignore_index_fires(tmp_path, side):
    result = run(_lm_recipe(tmp_path, _token_ce, padded_tokens(side=side)), PaddedLossCheck)["step.padded_loss"]
    assert codes(result) == {"O15"} and result.status == CheckStatus.WARNING
    message = result.issues[0].message
    assert f"id {PAD} fills the {side}" in message and "diluted" in message
    assert "ignore_index" in result.issues[0].fix and result.issues[0].code_fix.startswith("In your compute_loss")


@pytest.mark.parametrize("loss", [
    lambda m, b: _token_ce(m, b, ignore_index=PAD),                         # the pad id is ignored
    lambda m, b: _token_ce(m, b, weight=(torch.arange(VOCAB) != PAD).float()),  # a zero class weight masks it
])
def test_padding_the_criterion_ignores_is_quiet(tmp_path, loss):
    assert_quiet(run(_lm_recipe(tmp_path, loss), PaddedLossCheck)["step.padded_loss"])


def test_padding_marked_minus_100_and_unpadded_rows_are_quiet(tmp_path):
    assert_quiet(run(_lm_recipe(tmp_path, _token_ce, padded_tokens(pad_target=-100)), PaddedLossCheck)["step.padded_loss"])
    ids = torch.randint(1, VOCAB, (64, LENGTH + 1), generator=torch.Generator().manual_seed(0))
    unpadded = TensorDataset(ids[:, :-1], ids[:, 1:])
    assert_quiet(run(_lm_recipe(tmp_path / "full", _token_ce, unpadded), PaddedLossCheck)["step.padded_loss"])


def _per_token(model, batch):
    inputs, targets = batch
    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten(), reduction="none"), (targets != PAD).flatten()


@pytest.mark.parametrize(("loss", "words"), [
    (lambda m, b: _per_token(m, b)[0].mean(), "averaged over padding"),
    (lambda m, b: (lambda per, mask: (per * mask).mean())(*_per_token(m, b)), "divided by"),
    (lambda m, b: (lambda per, mask: (per * mask).sum() / mask.sum())(*_per_token(m, b)), None),
])
def test_reduction_none_is_judged_by_the_denominator(tmp_path, loss, words):
    result = run(_lm_recipe(tmp_path, loss), PaddedLossCheck)["step.padded_loss"]
    if words is None:
        assert_quiet(result)
    else:
        assert codes(result) == {"O15"} and words in result.issues[0].message


def test_a_mask_that_keeps_the_padding_instead_of_the_tokens_is_an_error(tmp_path):
    def inverted(model, batch):
        per, keep = _per_token(model, batch)
        pad = (~keep).float()  # mask = targets == PAD where != was meant
        return (per * pad).sum() / pad.sum()

    result = run(_lm_recipe(tmp_path, inverted), PaddedLossCheck)["step.padded_loss"]
    assert codes(result) == {"LOSS_MASK_INVERTED"} and result.issues[0].severity == Severity.ERROR
    assert "trains on the padding only" in result.issues[0].message and "ids != pad_id" in result.issues[0].fix


def test_edge_padding_tells_pad_ids_from_common_tokens():
    rows = torch.tensor([[5, 3, 7, 0, 0, 0], [4, 4, 2, 9, 0, 0], [1, 2, 3, 4, 5, 6], [8, 0 + 6, 5, 0, 0, 0]])
    profile, mask = edge_padding(rows, -100)
    assert profile.value == 0 and profile.side == "end" and profile.positions == 8 and int(mask.sum()) == 8
    # A space that ends some rows but fills their middles too is text, not padding.
    text = torch.tensor([[1, 32, 2, 32, 32], [32, 3, 32, 4, 32], [5, 32, 6, 32, 32], [32, 7, 32, 8, 9]])
    assert edge_padding(text, -100) == (None, None)
    # Hugging Face's shifted labels end every row with an ignored position: it does not break the run.
    shifted = torch.tensor([[5, 3, 0, 0, -100], [4, 2, 9, 0, -100], [7, 0, 0, 0, -100]])
    assert edge_padding(shifted, -100)[0].positions == 6
    assert edge_padding(shifted, 0) == (None, None)


def test_sorted_target_rows_are_not_left_padding():
    # A sorting task's targets (set d's T5): the smallest id fills the start of many rows and
    # occurs nowhere else, as a left pad id would; but every row is in order.
    generator = torch.Generator().manual_seed(0)
    sorted_rows = torch.randint(3, 13, (16, 8), generator=generator).sort(dim=1).values
    assert edge_padding(sorted_rows, -100) == (None, None)
    # Left padding of unsorted rows, and right padding whose rows hold one token, still fire.
    left = torch.cat([torch.zeros(16, 3, dtype=torch.long), torch.randint(3, 13, (16, 5), generator=generator)], 1)
    assert edge_padding(left, -100)[0].side == "start"
    short = torch.tensor([[7, 0, 0, 0], [5, 0, 0, 0], [9, 4, 0, 0], [3, 8, 6, 0]])
    assert edge_padding(short, -100)[0].value == 0


def test_flattened_targets_are_viewed_as_rows_of_the_batch():
    batch = (torch.zeros(4, 9, dtype=torch.long), torch.zeros(4, 9, dtype=torch.long))
    shapes = sequence_shapes(batch)
    assert as_rows(torch.zeros(36, dtype=torch.long), shapes).shape == (4, 9)
    assert as_rows(torch.zeros(32, dtype=torch.long), shapes).shape == (4, 8)  # shifted by one
    assert as_rows(torch.zeros(4, dtype=torch.long), shapes) is None           # one target per sample


# --------------------------------------------- O9 the loss's scale, beyond the step
def test_a_double_division_makes_the_real_step_k_times_too_small():
    """Why the toolkit's accumulation check cannot see it: the full batch is divided too."""
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 5, generator=generator), torch.randn(16, 3, generator=generator)

    def grads(loss, steps):
        torch.manual_seed(0)
        runner, optimizer = make_runner(nn.Linear(5, 3), loss, accumulation_steps=steps)
        runner.run(window([(x[i:i + 16 // steps], y[i:i + 16 // steps]) for i in range(0, 16, 16 // steps)]))
        return torch.cat([g.flatten() for g in optimizer.seen_grads[0]])

    divided = lambda m, b: F.mse_loss(m(b[0]), b[1]) / 4  # noqa: E731
    truth = grads(lambda m, b: F.mse_loss(m(b[0]), b[1]), 1)
    assert float(grads(divided, 4).norm() / truth.norm()) == pytest.approx(0.25, rel=1e-5)
    assert float(grads(divided, 4).norm() / grads(divided, 1).norm()) == pytest.approx(1.0, rel=1e-5)


def _ce(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def test_compute_loss_dividing_by_the_configured_steps_is_an_error(tmp_path):
    holder = {}
    ctx = plain_context(tmp_path, "trainer.accumulation_steps=4",
                         loss=lambda m, b: _ce(m, b) / holder["ctx"].cfg.trainer.accumulation_steps)
    holder["ctx"] = ctx
    results = run(ctx, LossScaleCheck, AccumulationCheck)
    result = results["step.loss_scale"]
    assert codes(result) == {"O9"} and result.status == CheckStatus.ERROR
    assert "divides its loss by trainer.accumulation_steps" in result.issues[0].message
    assert "4x too small" in result.issues[0].message
    assert ctx.cfg.trainer.accumulation_steps == 4  # the trial setting is put back
    assert_quiet(results["step.accumulation"])  # blind to it: the full batch is divided as well


def test_a_hard_coded_division_by_the_steps_is_a_warning(tmp_path):
    result = run(plain_context(tmp_path, "trainer.accumulation_steps=4", loss=lambda m, b: _ce(m, b) / 4),
                 LossScaleCheck)["step.loss_scale"]
    assert codes(result) == {"O9"} and result.status == CheckStatus.WARNING
    assert "1/4 of its criterion's loss" in result.issues[0].message


def by_hand(model, batch):
    """A cross-entropy written out, with no torch criterion for the probe to compare with."""
    logits = model(batch[0])
    return -(logits.log_softmax(-1).gather(1, batch[1][:, None])).mean()


@pytest.mark.parametrize("loss, fires", [
    (lambda m, b: by_hand(m, b) / 4, True),
    (lambda m, b: 0.25 * by_hand(m, b), True),
    (lambda m, b: by_hand(m, b) / 2, False),  # a weight that is not the steps
    (by_hand, False),
], ids=["divided", "times_a_quarter", "halved", "plain"])
def test_a_hand_written_loss_divided_by_the_steps_is_read_from_its_graph(tmp_path, loss, fires):
    result = run(plain_context(tmp_path, "trainer.accumulation_steps=4", loss=loss), LossScaleCheck)["step.loss_scale"]
    assert (codes(result) == {"O9"}) == fires
    if fires:
        assert "1/4 of the loss it computes" in result.issues[0].message


def test_a_double_division_in_a_plain_loop(tmp_path):
    torch.manual_seed(0)
    model = classifier()
    loader = DataLoader(TensorDataset(torch.randn(64, FEATURES), torch.randint(0, CLASSES, (64,))), batch_size=16,
                        shuffle=True)
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, accumulation_steps=2,
                           loss_fn=lambda m, b: _ce(m, b) / 2,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossScaleCheck()])
    issue = report.check("step.loss_scale").issues[0]
    assert issue.code == "O9" and issue.severity == Severity.WARNING and "Remove the division" in issue.fix


@pytest.mark.parametrize("steps", [1, 2])
def test_a_mean_loss_with_or_without_accumulation_is_quiet(tmp_path, steps):
    assert_quiet(run(plain_context(tmp_path, f"trainer.accumulation_steps={steps}"), LossScaleCheck)["step.loss_scale"])


def _summed(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1], reduction="sum")


def _manual_sum(model, batch):
    return (model(batch[0]) - F.one_hot(batch[1], CLASSES).float()).pow(2).sum()


@pytest.mark.parametrize("loss", [_summed, _manual_sum])
def test_a_summed_loss_without_accumulation_fires(tmp_path, loss):
    result = run(plain_context(tmp_path, loss=loss), LossScaleCheck)["step.loss_scale"]
    assert codes(result) == {"O9"} and result.status == CheckStatus.WARNING
    assert "sum over the batch" in result.issues[0].message


@pytest.mark.parametrize("optimizer", [lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3),
                                       lambda m: torch.optim.RMSprop(m.parameters(), lr=1e-3)])
def test_a_summed_loss_is_a_note_where_the_optimizer_normalises_its_scale_and_nothing_clips(tmp_path, optimizer):
    ctx = plain_context(tmp_path, "trainer.clip_grad_norm=null", loss=_summed, optimizer=optimizer)
    result = run(ctx, LossScaleCheck)["step.loss_scale"]
    assert_quiet(result)
    assert any(issue.code == "O9" and "sum over the batch" in issue.message for issue in result.issues)


@pytest.mark.parametrize(("overrides", "optimizer"), [
    (("trainer.clip_grad_norm=null",), lambda m: torch.optim.SGD(m.parameters(), lr=0.1)),
    (("trainer.clip_grad_norm=1.0",), lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3)),
    (("trainer.clip_grad_norm=null",), lambda m: torch.optim.Adam(m.parameters(), lr=1e-3, weight_decay=1e-2)),
], ids=["sgd", "clipped_adamw", "adam_l2_decay"])
def test_a_summed_loss_warns_where_its_size_reaches_the_update(tmp_path, overrides, optimizer):
    result = run(plain_context(tmp_path, *overrides, loss=_summed, optimizer=optimizer), LossScaleCheck)["step.loss_scale"]
    assert codes(result) == {"O9"} and result.status == CheckStatus.WARNING


def test_a_loss_that_adds_up_over_the_batch_by_mixing_its_samples_warns_under_adam_too(tmp_path):
    """A distance taken over the whole batch (.sum() with no dim) grows with the batch like a
    sum, but it is no sum of per-sample terms: no optimizer makes it harmless."""
    def batch_distance(model, batch):
        scores = model(batch[0]) - F.one_hot(batch[1], CLASSES).float()
        return scores.pow(2).sum() * batch[1].float().mean()

    ctx = plain_context(tmp_path, "trainer.clip_grad_norm=null", loss=batch_distance,
                        optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=1e-3))
    result = run(ctx, LossScaleCheck)["step.loss_scale"]
    assert codes(result) == {"O9"} and result.status == CheckStatus.WARNING


def test_a_sum_divided_by_its_count_is_quiet(tmp_path):
    def mean_by_count(model, batch):
        return _summed(model, batch) / len(batch[1]), len(batch[1])

    assert_quiet(run(plain_context(tmp_path, loss=mean_by_count), LossScaleCheck)["step.loss_scale"])


def test_the_accumulation_check_names_a_sum_as_the_cause(tmp_path):
    ctx = plain_context(tmp_path, "trainer.accumulation_steps=2", loss=_summed)
    results = run(ctx, AccumulationCheck, LossScaleCheck)
    issue = results["step.accumulation"].issues[0]
    assert issue.code == "O9" and "i.e. 1/2: compute_loss returns a sum" in issue.message
    assert_quiet(results["step.loss_scale"])  # reported once, by the check that measured it


# ---------------------------------------------- O5 a step that leaves eval mode on
def _dropout_classifier():
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, CLASSES))


def _eval_after_forward(model, batch):
    loss = _ce(model, batch)
    model.eval()  # e.g. to compute a metric, never switched back
    return loss


def test_compute_loss_leaving_the_model_in_eval_fires(tmp_path):
    result = run(plain_context(tmp_path, model=_dropout_classifier, loss=_eval_after_forward), FirstStepCheck)["step.first_step"]
    assert codes(result) == {"O5"} and result.status == CheckStatus.WARNING
    assert "leaves 1 dropout/BatchNorm module(s) in eval mode (2)" in result.issues[0].message
    assert "model.train(was_training)" in result.issues[0].fix


def test_a_forward_hook_switching_to_eval_fires(tmp_path):
    def switch_to_eval(module, args, output):
        module.eval()  # returns None: the output stays the forward's

    def model():
        net = _dropout_classifier()
        net.register_forward_hook(switch_to_eval)
        return net

    result = run(plain_context(tmp_path, model=model), FirstStepCheck)["step.first_step"]
    assert codes(result) == {"O5"} and "leaves" in result.issues[0].message


class SwitchesOwnDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = _dropout_classifier()

    def forward(self, x):
        self.body[2].eval()  # the bug: inside the model's own forward
        return self.body(x)


def test_a_dropout_switched_off_inside_the_forward_fires(tmp_path):
    result = run(plain_context(tmp_path, model=SwitchesOwnDropout), FirstStepCheck)["step.first_step"]
    assert codes(result) == {"O5"} and "ran in eval mode during the training forward" in result.issues[0].message


def test_an_eval_pass_that_restores_train_mode_is_quiet(tmp_path):
    def with_teacher_pass(model, batch):
        was_training = model.training
        model.eval()
        with torch.no_grad():
            reference = model(batch[0])
        model.train(was_training)
        return _ce(model, batch) + 0 * reference.sum()

    assert_quiet(run(plain_context(tmp_path, model=_dropout_classifier, loss=with_teacher_pass), FirstStepCheck)["step.first_step"])


class Distilled(nn.Module):
    """A frozen teacher inside the model, kept in eval by compute_loss on purpose."""

    def __init__(self):
        super().__init__()
        self.student = _dropout_classifier()
        self.teacher = _dropout_classifier().requires_grad_(False)

    def forward(self, x):
        return self.student(x), self.teacher(x)


def test_a_frozen_teacher_kept_in_eval_is_quiet(tmp_path):
    def distill(model, batch):
        model.teacher.eval()
        student, teacher = model(batch[0])
        return F.cross_entropy(student, batch[1]) + F.mse_loss(student, teacher)

    assert_quiet(run(plain_context(tmp_path, model=Distilled, loss=distill), FirstStepCheck)["step.first_step"])


class KeepsDropoutOff(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = _dropout_classifier()

    def forward(self, x):
        return self.body(x)

    def train(self, mode=True):
        super().train(mode)
        self.body[2].eval()  # an overridden train(): ModesCheck's O5
        return self


class FrozenNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(FEATURES, 8), nn.BatchNorm1d(8)).requires_grad_(False)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x):
        self.backbone[1].eval()  # the O18 fix, applied every step
        return self.head(self.backbone(x))


def test_modes_the_model_check_owns_are_not_reported_twice(tmp_path):
    results = run(plain_context(tmp_path, model=KeepsDropoutOff), ModesCheck, FirstStepCheck)
    assert codes(results["model.modes"]) == {"O5"}
    assert_quiet(results["step.first_step"])


def test_frozen_batchnorm_put_in_eval_by_the_step_is_quiet(tmp_path):
    assert_quiet(run(plain_context(tmp_path, model=FrozenNorm), FirstStepCheck)["step.first_step"])


# ------------------------------------------------------------- healthy setups
def test_the_default_char_lm_is_quiet(tmp_path):
    for result in run(make_recipe(tmp_path, classification=False), *CONTRACT_CHECKS).values():
        assert_quiet(result)


def _image_data(samples: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(samples, 1, 8, 8, generator=generator),
                         torch.randint(0, CLASSES, (samples,), generator=generator))


def _cnn():
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.1), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, CLASSES))


@pytest.mark.parametrize(("model", "dataset"), [(_dropout_classifier, None), (_cnn, _image_data())])
def test_an_mlp_and_a_cnn_on_a_shuffled_loader_are_quiet(tmp_path, model, dataset):
    ctx = plain_context(tmp_path, model=model, dataset=dataset,
                         loader=lambda data: DataLoader(data, batch_size=16, shuffle=True))
    for result in run(ctx, *CONTRACT_CHECKS).values():
        assert_quiet(result)


# ----------------------------------------------------------- Hugging Face models
HF_VOCAB, HF_PAD = 97, 96  # GPT-2 style: the EOS id pads


@pytest.fixture
def transformers():
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    return transformers


class Texts(torch.utils.data.Dataset):
    def __init__(self, samples: int = 32):
        generator = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(0, HF_PAD, (int(n),), generator=generator)
                     for n in torch.randint(4, 17, (samples,), generator=generator)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]


def causal_collate(mask_padding: bool):
    """Right padding with an attention mask; labels -100 at padding (what
    DataCollatorForLanguageModeling does) or, the bug, a plain copy of the ids."""

    def collate(rows):
        length = max(len(row) for row in rows)
        ids = torch.full((len(rows), length), HF_PAD)
        mask = torch.zeros(len(rows), length, dtype=torch.long)
        for index, row in enumerate(rows):
            ids[index, :len(row)], mask[index, :len(row)] = row, 1
        labels = ids.masked_fill(mask == 0, -100) if mask_padding else ids.clone()
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return collate


def mlm_collate(rows):
    batch = causal_collate(True)(rows)
    chosen = (torch.rand(batch["labels"].shape, generator=torch.Generator().manual_seed(1)) < 0.15) & (batch["attention_mask"] == 1)
    batch["labels"] = batch["input_ids"].masked_fill(~chosen, -100)
    batch["input_ids"] = batch["input_ids"].masked_fill(chosen, HF_PAD - 1)  # the [MASK] id
    return batch


def _hf_model(transformers, kind: str):
    torch.manual_seed(0)
    if kind == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=HF_VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2, eos_token_id=HF_PAD,
            pad_token_id=HF_PAD))
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=HF_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=2, max_position_embeddings=32, pad_token_id=HF_PAD))
    return transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=HF_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=32, pad_token_id=HF_PAD))


def _hf_report(model, collate, accumulation_steps: int = 1):
    loader = DataLoader(Texts(), batch_size=8, shuffle=True, collate_fn=collate)
    return run_preflight(model, torch.optim.AdamW(model.parameters(), lr=1e-3), loader,
                         accumulation_steps=accumulation_steps,
                         checks=[FirstBatchCheck(), FirstStepCheck(), PaddedLossCheck(), LossScaleCheck()])


@pytest.mark.parametrize(("kind", "collate", "steps"), [
    ("gpt2", causal_collate(True), 1),
    ("llama", causal_collate(True), 2),
    ("bert", mlm_collate, 1),
])
def test_hugging_face_models_with_labels_masked_at_padding_are_quiet(transformers, kind, collate, steps):
    report = _hf_report(_hf_model(transformers, kind), collate, steps)
    assert [(check.name, issue.message) for check, issue in report.issues() if issue.severity != Severity.INFO] == []
    assert report.check("step.padded_loss").status == CheckStatus.PASSED


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_hugging_face_labels_copied_from_padded_ids_fire(transformers, kind):
    report = _hf_report(_hf_model(transformers, kind), causal_collate(False))
    issues = report.check("step.padded_loss").issues
    assert [issue.code for issue in issues] == ["O15"]
    assert "where attention_mask is 0 (padding) are not -100" in issues[0].message
    assert "labels[attention_mask == 0] = -100" in issues[0].fix


def test_reduction_none_averaged_over_ignored_positions_fires(tmp_path):
    """ignore_index zeroes the ignored positions of reduction='none', and .mean() still counts them."""
    def diluted(model, batch):
        return _token_ce(model, batch, reduction="none").mean()

    def per_target(model, batch):
        return _token_ce(model, batch, reduction="none").sum() / (batch[1] != -100).sum()

    data = padded_tokens(pad_target=-100)
    result = run(_lm_recipe(tmp_path, diluted, data), PaddedLossCheck)["step.padded_loss"]
    assert codes(result) == {"O15"} and "ignored positions" in result.issues[0].message
    assert_quiet(run(_lm_recipe(tmp_path / "ok", per_target, data), PaddedLossCheck)["step.padded_loss"])


def test_a_teacher_pass_that_never_switches_back_fires(tmp_path):
    def teacher_then_student(model, batch):
        model.eval()
        with torch.no_grad():
            teacher = model(batch[0])
        student = model(batch[0])  # still in eval mode
        return _ce(model, batch) + F.mse_loss(student, teacher)

    result = run(plain_context(tmp_path, model=_dropout_classifier, loss=teacher_then_student), FirstStepCheck)["step.first_step"]
    assert codes(result) == {"O5"} and "the training forward ran with the model in eval mode" in result.issues[0].message
