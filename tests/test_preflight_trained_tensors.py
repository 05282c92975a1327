"""What is trained: learnable tensors outside the registered parameters, loss tensors no
optimizer updates, keep-probabilities given as dropout rates, broken weight ties of
Hugging Face models, and a model left in eval mode by a plain loop. Each defect is
written the way users write it and run through ``run_preflight``; each has a healthy
twin that stays quiet."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.dropout_rate import DropoutInEvalCheck, DropoutRateCheck
from optimus_preflight.preflight.checks.model_checks import ModesCheck, OptimizerParamsCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, GradientsCheck
from optimus_preflight.preflight.checks.tied_embeddings import TiedEmbeddingsCheck
from optimus_preflight.preflight.checks.trained_tensors import (
    FreshTensorsCheck,
    LossTensorsCheck,
    UnregisteredTensorsCheck,
)
from optimus_preflight.preflight.framework import Severity

FEATURES, CLASSES = 12, 3


def data(samples: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, FEATURES, generator=generator)
    return TensorDataset(inputs, inputs[:, :CLASSES].argmax(1))


def loader() -> DataLoader:
    return DataLoader(data(), batch_size=16, shuffle=True)


def loud(report, name: str | None = None) -> list[tuple[str, str, str]]:
    return [(check.name, issue.code, issue.severity.value) for check, issue in report.issues()
            if issue.severity != Severity.INFO and (name is None or check.name == name)]


def issue_of(report, name: str):
    return next(issue for check, issue in report.issues() if check.name == name)


WIRING = (OptimizerParamsCheck, UnregisteredTensorsCheck, FirstBatchCheck, FirstStepCheck, GradientsCheck,
          LossTensorsCheck)


def preflight(model, optimizer, *, loss_fn=None, checks=WIRING, **kwargs):
    return run_preflight(model, optimizer, kwargs.pop("train_loader", None) or loader(),
                         loss_fn=loss_fn or nn.CrossEntropyLoss(), checks=[cls() for cls in checks], **kwargs)


# ---------------------------------------------------------------- learnable tensors kept as plain attributes

class ScaledMLP(nn.Module):
    """A learnable temperature kept as a plain tensor: never registered."""

    def __init__(self, register: bool = False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))
        self.scale = nn.Parameter(torch.ones(1)) if register else torch.ones(1, requires_grad=True)

    def forward(self, x):
        return self.net(x) * self.scale


class ListOfHeads(nn.Module):
    """nn.Parameters in a plain Python list (not nn.ParameterList)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(FEATURES, 16)
        self.gates = [nn.Parameter(torch.ones(16)) for _ in range(2)]
        self.head = nn.Linear(16, CLASSES)

    def forward(self, x):
        hidden = self.body(x)
        for gate in self.gates:
            hidden = torch.relu(hidden * gate)
        return self.head(hidden)


def test_a_plain_tensor_with_requires_grad_is_reported_as_never_trained():
    model = ScaledMLP()
    report = preflight(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    assert loud(report) == [("model.unregistered_tensors", "PARAM_UNREGISTERED", "error")]
    issue = issue_of(report, "model.unregistered_tensors")
    assert "scale (a tensor with requires_grad=True)" in issue.message and "never change" in issue.message
    assert "nn.Parameter(torch.ones(1))" in issue.fix
    # The preflight's steps left no gradient on it: the loop starts as it would have.
    assert model.scale.grad is None


def test_parameters_in_a_plain_list_are_reported():
    model = ListOfHeads()
    report = preflight(model, torch.optim.SGD(model.parameters(), lr=0.1))
    issue = issue_of(report, "model.unregistered_tensors")
    assert issue.code == "PARAM_UNREGISTERED" and issue.severity == Severity.ERROR
    assert "gates[0] (an nn.Parameter in a plain container)" in issue.message


def test_layers_in_a_plain_list_are_reported():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = [nn.Linear(16, 16) for _ in range(2)]  # not an nn.ModuleList
            self.inp, self.out = nn.Linear(FEATURES, 16), nn.Linear(16, CLASSES)

        def forward(self, x):
            hidden = torch.relu(self.inp(x))
            for block in self.blocks:
                hidden = torch.relu(block(hidden))
            return self.out(hidden)

    model = Stack()
    issue = issue_of(preflight(model, torch.optim.SGD(model.parameters(), lr=0.1)), "model.unregistered_tensors")
    assert "4 learnable tensor(s)" in issue.message and "blocks[0].weight (of a layer in a plain container)" in issue.message
    assert "nn.ModuleList" in issue.fix


def test_an_unregistered_tensor_added_to_the_optimizer_by_hand_is_a_warning_not_a_copy():
    model = ScaledMLP()
    optimizer = torch.optim.AdamW([*model.parameters(), model.scale], lr=1e-3)
    before = model.scale.detach().clone()
    report = preflight(model, optimizer)
    assert loud(report) == [("model.unregistered_tensors", "PARAM_UNREGISTERED", "warning")]
    assert "state_dict()" in issue_of(report, "model.unregistered_tensors").message
    # The preflight's optimizer steps moved it; the snapshot put it back.
    assert torch.equal(model.scale.detach(), before) and model.scale.grad is None


def test_registered_frozen_and_buffered_tensors_are_quiet():
    class Healthy(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(FEATURES, 16)
            self.embed.requires_grad_(False)  # frozen on purpose, not in the optimizer
            self.scale = nn.Parameter(torch.ones(1))
            self.register_buffer("mean", torch.zeros(FEATURES))
            self.constant = torch.full((1,), 2.0)  # a plain tensor without requires_grad
            self.gates = nn.ParameterList([nn.Parameter(torch.ones(16))])
            self.alias = [self.scale]  # a list holding a registered parameter
            self.head = nn.Linear(16, CLASSES)

        def forward(self, x):
            return self.head(torch.relu(self.embed(x - self.mean)) * self.gates[0]) * self.scale / self.constant

    model = Healthy()
    trainable = [p for p in model.parameters() if p.requires_grad]
    report = preflight(model, torch.optim.AdamW([{"params": trainable[:1], "lr": 1e-4},
                                                 {"params": trainable[1:], "lr": 1e-3}]))
    assert loud(report) == []


# ---------------------------------------------------------------- loss tensors outside the model

class CenterLoss(nn.Module):
    """Cross-entropy plus a pull towards learnable class centres (its own parameters)."""

    def __init__(self):
        super().__init__()
        self.centers = nn.Parameter(torch.randn(CLASSES, CLASSES))

    def forward(self, logits, targets):
        return F.cross_entropy(logits, targets) + 0.1 * (logits - self.centers[targets]).pow(2).mean()


def test_a_loss_module_whose_parameters_are_not_optimized_is_reported():
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))
    report = preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=CenterLoss())
    assert loud(report) == [("step.loss_tensors", "O2", "warning")]
    issue = issue_of(report, "step.loss_tensors")
    assert "loss_fn.centers" in issue.message and "requires_grad_(False)" in issue.fix


def test_a_learnable_loss_weight_in_a_closure_is_reported():
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))
    log_var = torch.zeros(1, requires_grad=True)  # uncertainty weighting, forgotten in the optimizer

    def loss_fn(model, batch):
        inputs, targets = batch
        return torch.exp(-log_var) * F.cross_entropy(model(inputs), targets) + log_var

    report = preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=loss_fn)
    assert loud(report) == [("step.loss_tensors", "O2", "warning")]
    assert "log_var" in issue_of(report, "step.loss_tensors").message
    assert log_var.grad is None


def test_a_loss_module_in_the_optimizer_and_a_no_grad_teacher_are_quiet_and_restored():
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))
    criterion = CenterLoss()
    optimizer = torch.optim.SGD([*model.parameters(), *criterion.parameters()], lr=0.1)
    centers = criterion.centers.detach().clone()
    report = preflight(model, optimizer, loss_fn=criterion)
    assert loud(report) == []
    assert torch.equal(criterion.centers.detach(), centers) and criterion.centers.grad is None

    teacher = nn.Sequential(nn.Linear(FEATURES, CLASSES))  # requires_grad left on, used under no_grad

    def distill(model, batch):
        inputs, _ = batch
        with torch.no_grad():
            soft = teacher(inputs).softmax(-1)
        return F.cross_entropy(model(inputs), soft)

    report = preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=distill)
    assert loud(report) == []


def test_an_optimizer_built_from_the_encoder_only_is_o2():
    class EncoderHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU())
            self.head = nn.Linear(16, CLASSES)

        def forward(self, x):
            return self.head(self.encoder(x))

    model = EncoderHead()
    report = preflight(model, torch.optim.SGD(model.encoder.parameters(), lr=0.1))
    assert ("model.optimizer_params", "O2", "error") in loud(report)
    assert "head.weight" in issue_of(report, "model.optimizer_params").message


class FactorsCastAfterWrapping(nn.Module):
    """Matrix factorisation whose factors are nn.Parameter(array).float(): non-leaf attributes."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.users = nn.Parameter(torch.randn(20, 4, dtype=torch.float64, generator=generator)).float()
        self.items = nn.Parameter(torch.randn(30, 4, dtype=torch.float64, generator=generator)).float()
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, pairs):
        return (self.users[pairs[:, 0]] * self.items[pairs[:, 1]]).sum(-1) + self.bias


def test_a_model_deepcopy_refuses_runs_every_check_and_names_the_cast():
    # The memory estimate copies the model; a non-leaf attribute made that copy (and the
    # memory checks) crash instead of reporting the user's bug.
    generator = torch.Generator().manual_seed(1)
    pairs = torch.stack([torch.randint(0, 20, (256,), generator=generator),
                         torch.randint(0, 30, (256,), generator=generator)], dim=1)
    ratings = torch.randn(256, generator=generator)
    model = FactorsCastAfterWrapping()
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           DataLoader(TensorDataset(pairs, ratings), batch_size=32, shuffle=True), loss_fn=nn.MSELoss())
    assert not [result.name for result in report.checks if result.status.value == "crashed"]
    assert ("model.unregistered_tensors", "PARAM_UNREGISTERED", "error") in loud(report)


# ---------------------------------------------------------------- layers built inside forward
class HeadInForward(nn.Module):
    """The classifier head built where its input size is known: inside forward."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU())

    def forward(self, x):
        hidden = self.body(x)
        return nn.Linear(hidden.shape[1], CLASSES)(hidden)


class NoiseGateInForward(nn.Module):
    """A 'learnable' gate created with torch.randn(..., requires_grad=True) on every call."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))

    def forward(self, x):
        gate = torch.randn(FEATURES, requires_grad=True)
        return self.net(x * torch.sigmoid(gate))


FRESH = (*WIRING, FreshTensorsCheck)


@pytest.mark.parametrize("build, shapes", [(HeadInForward, "shapes (3, 16), (3,);"),
                                           (NoiseGateInForward, "shapes (12,);")])
def test_learnable_tensors_created_in_every_forward_are_an_error(build, shapes):
    torch.manual_seed(0)
    model = build()
    report = preflight(model, torch.optim.Adam(model.parameters(), lr=1e-3), checks=FRESH)
    assert ("step.fresh_tensors", "PARAM_CREATED_IN_FORWARD", "error") in loud(report)
    issue = issue_of(report, "step.fresh_tensors")
    assert shapes in issue.message and "__init__" in issue.fix


def test_tensors_outside_the_model_that_persist_are_not_fresh():
    # A loss module's weights forgotten by the optimizer, and an unregistered temperature:
    # the same tensors at every call (O2 and PARAM_UNREGISTERED name them), never re-created.
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))
    report = preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=CenterLoss(), checks=FRESH)
    assert not loud(report, "step.fresh_tensors")
    scaled = ScaledMLP()
    report = preflight(scaled, torch.optim.SGD(scaled.parameters(), lr=0.1), checks=FRESH)
    assert not loud(report, "step.fresh_tensors") and loud(report, "model.unregistered_tensors")


def test_a_loss_rebuilt_from_item_values_names_the_new_leaf_not_a_fresh_layer():
    # Summed "for logging": a new leaf with no graph back to the model.
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))

    def loss_fn(model, batch):
        inputs, targets = batch
        logits = model(inputs)
        losses = [F.cross_entropy(logits, targets), 0.1 * logits.pow(2).mean()]
        return torch.tensor([loss.item() for loss in losses], requires_grad=True).sum()

    report = preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=loss_fn, checks=FRESH)
    assert loud(report) == [("step.gradients", "GRAD_NONE", "error")]
    issue = issue_of(report, "step.gradients")
    assert "torch.tensor([...], requires_grad=True)" in issue.message and "(2,)" in issue.message
    assert "cls_loss + reg_loss" in issue.fix


def test_a_loss_computed_in_numpy_and_rewrapped_is_named_as_a_leaf_with_no_graph():
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))

    def loss_fn(model, batch):
        inputs, targets = batch
        error = targets.float().numpy()[:, None] - model(inputs).detach().numpy()
        return torch.tensor(float(np.maximum(0.7 * error, -0.3 * error).mean()), requires_grad=True)

    report = preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=loss_fn, checks=FRESH)
    assert loud(report) == [("step.gradients", "GRAD_NONE", "error")]
    issue = issue_of(report, "step.gradients")
    assert "itself a new leaf tensor with no grad_fn" in issue.message and "torch.tensor(value, requires_grad=True)" in issue.message
    assert "torch operations on the model's output" in issue.fix


# ---------------------------------------------------------------- dropout rates

DROPOUT = (DropoutRateCheck,)


def mlp_with_dropout(p: float) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(p), nn.Linear(16, CLASSES))


class FunctionalDropout(nn.Module):
    def __init__(self, dropout: float):
        super().__init__()
        self.dropout = dropout  # handed to F.dropout, as Hugging Face attention layers do
        self.body, self.head = nn.Linear(FEATURES, 16), nn.Linear(16, CLASSES)

    def forward(self, x):
        return self.head(F.dropout(torch.relu(self.body(x)), p=self.dropout, training=self.training))


class LiteralDropout(nn.Module):
    """The rate written into the forward: no module or config holds it."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(FEATURES, 16), nn.Linear(16, CLASSES)

    def forward(self, x):
        return self.head(F.dropout(torch.relu(self.body(x)), 0.9, self.training))


class LastStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(FEATURES, 8, num_layers=2, dropout=0.9, batch_first=True)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x):
        return self.head(self.lstm(x.unsqueeze(1))[0][:, -1])


@pytest.mark.parametrize(("build", "named"), [
    (lambda: mlp_with_dropout(0.9), "2 (Dropout) p=0.9"),
    (lambda: mlp_with_dropout(0.75), "2 (Dropout) p=0.75"),
    (lambda: FunctionalDropout(0.8), "dropout (FunctionalDropout) p=0.8"),
    (LiteralDropout, "a dropout call in LiteralDropout's forward p=0.9"),
    (LastStep, "lstm.dropout (LSTM) p=0.9"),
], ids=["nn.Dropout", "keep-prob-0.75", "functional", "literal", "lstm"])
def test_a_keep_probability_given_as_p_is_a_warning(build, named):
    model = build()
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loader(),
                           checks=[FirstBatchCheck(), *(cls() for cls in DROPOUT)])
    assert named in issue_of(report, "model.dropout_rate").message
    assert loud(report) == [("model.dropout_rate", "DROPOUT_KEEP_PROB", "warning")]
    issue = issue_of(report, "model.dropout_rate")
    assert "probability of ZEROING" in issue.message and "1 - keep_prob" in issue.fix


def test_p_of_one_is_an_error():
    model = mlp_with_dropout(1.0)
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loader(),
                           checks=[FirstBatchCheck(), *(cls() for cls in DROPOUT)])
    assert loud(report) == [("model.dropout_rate", "DROPOUT_KEEP_PROB", "error")]


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.65, 0.7])
def test_usual_dropout_rates_are_quiet(p):
    model = mlp_with_dropout(p)
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loader(),
                           checks=[FirstBatchCheck(), *(cls() for cls in DROPOUT)])
    assert loud(report) == []


class FrozenTeacher(nn.Module):
    def __init__(self, keep_teacher_in_eval: bool):
        super().__init__()
        self.keep = keep_teacher_in_eval
        self.teacher = mlp_with_dropout(0.9).requires_grad_(False)
        self.head = nn.Linear(CLASSES, CLASSES)

    def forward(self, x):
        return self.head(self.teacher(x))

    def train(self, mode: bool = True):
        super().train(mode)
        if self.keep:
            self.teacher.eval()
        return self


@pytest.mark.parametrize("keep_in_eval", [True, False])
def test_a_frozen_part_counts_only_when_its_dropout_runs_in_training(keep_in_eval):
    model = FrozenTeacher(keep_in_eval)
    report = run_preflight(model, torch.optim.SGD(model.head.parameters(), lr=0.1), loader(),
                           checks=[FirstBatchCheck(), *(cls() for cls in DROPOUT)])
    if keep_in_eval:
        assert loud(report) == []
    else:  # model.train() turns the frozen part's dropout on: the head trains on what survives
        assert "teacher.2 (Dropout) p=0.9" in issue_of(report, "model.dropout_rate").message


# ---------------------------------------------------------------- Hugging Face configs and ties

@pytest.fixture
def transformers():
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    return transformers


VOCAB = 64


def gpt2(transformers, **extra):
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32,
                                                                n_layer=1, n_head=2, bos_token_id=0,
                                                                eos_token_id=0, **extra))


def bert(transformers, **extra):
    return transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=VOCAB, hidden_size=32,
                                                                num_hidden_layers=1, num_attention_heads=2,
                                                                intermediate_size=64, max_position_embeddings=32,
                                                                **extra))


def t5(transformers, **extra):
    return transformers.T5ForConditionalGeneration(transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=16,
                                                                         d_ff=64, num_layers=1, num_heads=2,
                                                                         decoder_start_token_id=0, **extra))


def token_loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (32, 16), generator=generator)
    rows = [{"input_ids": row, "labels": row.clone()} for row in ids]
    return DataLoader(rows, batch_size=8, shuffle=True)


HF_CHECKS = (FirstBatchCheck, DropoutRateCheck, TiedEmbeddingsCheck, UnregisteredTensorsCheck)


def hf_preflight(model, optimizer=None):
    return run_preflight(model, optimizer or torch.optim.AdamW(model.parameters(), lr=1e-4), token_loader(),
                         checks=[cls() for cls in HF_CHECKS])


def test_tiny_hf_models_are_quiet(transformers):
    for model in (gpt2(transformers), bert(transformers), t5(transformers),
                  t5(transformers, tie_word_embeddings=False, feed_forward_proj="gated-gelu"),
                  gpt2(transformers, tie_word_embeddings=False)):
        assert loud(hf_preflight(model)) == [], type(model).__name__


def test_hf_dropout_probabilities_that_read_like_keep_probabilities(transformers):
    report = hf_preflight(bert(transformers, hidden_dropout_prob=0.9, attention_probs_dropout_prob=0.9))
    assert loud(report) == [("model.dropout_rate", "DROPOUT_KEEP_PROB", "warning")]
    issue = issue_of(report, "model.dropout_rate")
    # Named once by their config fields, not once per layer built from them.
    assert "config.hidden_dropout_prob=0.9" in issue.message and "bert.encoder" not in issue.message
    assert "from_pretrained(name, hidden_dropout_prob=0.1" in issue.fix


def test_a_replaced_lm_head_breaks_the_declared_tie(transformers):
    model = gpt2(transformers)
    model.lm_head = nn.Linear(32, VOCAB, bias=False)  # "a fresh head", after the model tied its own
    report = hf_preflight(model)
    assert loud(report) == [("model.tied_embeddings", "TIED_WEIGHTS_BROKEN", "warning")]
    issue = issue_of(report, "model.tied_embeddings")
    assert "lm_head.weight is not transformer.wte.weight" in issue.message
    # The printed fix works: tie, rebuild the optimizer, and the check is quiet.
    model.tie_weights()
    assert loud(hf_preflight(model)) == []


def test_a_cloned_embedding_head_is_reported_as_equal_but_separate(transformers):
    model = bert(transformers)
    decoder = model.cls.predictions.decoder
    decoder.weight = nn.Parameter(decoder.weight.detach().clone())
    issue = issue_of(hf_preflight(model), "model.tied_embeddings")
    assert "equal values, separate tensors" in issue.message


def test_a_wrapped_hf_model_is_looked_into(transformers):
    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = gpt2(transformers)
            self.lm.lm_head = nn.Linear(32, VOCAB, bias=False)

        def forward(self, **batch):
            return self.lm(**batch)

    issue = issue_of(hf_preflight(Wrapper()), "model.tied_embeddings")
    assert "lm.lm_head.weight is not lm.transformer.wte.weight" in issue.message


# ---------------------------------------------------------------- a model left in eval mode

def bn_cnn() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(16, CLASSES))


def test_a_model_left_in_eval_by_a_plain_loop_is_reported():
    model = bn_cnn()
    model.eval()  # e.g. after a baseline evaluation; the loop never calls model.train()
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loader(), checks=[ModesCheck()])
    assert loud(report) == [("model.modes", "O5", "warning")]
    issue = issue_of(report, "model.modes")
    assert "was in eval mode when the preflight was called" in issue.message
    assert issue.fix.startswith("Call model.train() before your training loop")
    assert not model.training  # the preflight leaves the mode it found
    result = next(check for check in report.checks if check.name == "model.modes")
    assert result.data["model_in_eval_when_called"] and "eval mode when called" in result.data["summary"]


def test_a_model_in_train_mode_or_a_loop_that_sets_it_is_quiet():
    model = bn_cnn()
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loader(), checks=[ModesCheck()])
    assert loud(report) == []
    model.eval()  # e.g. from_pretrained returns models in eval; the loop calls model.train() itself
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loader(), checks=[ModesCheck()],
                           loop_calls_train=True)
    assert loud(report) == []


def test_a_hugging_face_model_from_pretrained_in_eval_is_only_a_note(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64, num_labels=CLASSES)
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "bert")
    model = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "bert")
    assert not model.training  # from_pretrained's own eval(); loops written for it call model.train()
    ids = torch.randint(0, VOCAB, (64, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": torch.tensor(i % CLASSES)} for i, row in enumerate(ids)]
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), lr=1e-4),
                           DataLoader(data, batch_size=8, shuffle=True), checks=[ModesCheck()])
    assert loud(report) == []
    issue = issue_of(report, "model.modes")
    assert issue.severity.value == "info" and "from_pretrained returns it so" in issue.message


def test_a_model_without_dropout_or_batchnorm_in_eval_is_quiet():
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES)).eval()
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loader(), checks=[ModesCheck()])
    assert loud(report) == []


def test_a_recipe_sets_train_mode_itself(tmp_path):
    from tests.preflight_support import assert_quiet, plain_context, run

    ctx = plain_context(tmp_path, model=bn_cnn)
    ctx.model.eval()
    assert_quiet(run(ctx, ModesCheck)["model.modes"])


# ---------------------------------------------------------------- a recipe's objects, the full default list

def test_a_recipe_model_with_an_unregistered_tensor_and_a_criterion_it_forgot(tmp_path):
    from tests import preflight_support as support

    class Gain(nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = torch.ones(support.CLASSES, requires_grad=True)

        def forward(self, x):
            return x * self.gain

    centers = torch.randn(support.CLASSES, support.CLASSES, requires_grad=True)

    def loss(model, batch):  # a centre loss whose centres live beside the recipe's loss
        inputs, targets = batch
        logits = model(inputs)
        return F.cross_entropy(logits, targets) + 0.1 * (logits - centers[targets]).pow(2).mean()

    ctx = support.plain_context(tmp_path, model=lambda: support.classifier().append(Gain()), loss=loss)
    results = support.run(ctx, UnregisteredTensorsCheck, LossTensorsCheck)
    assert support.codes(results["model.unregistered_tensors"]) == {"PARAM_UNREGISTERED"}
    assert "3.gain" in results["model.unregistered_tensors"].issues[0].message
    assert support.codes(results["step.loss_tensors"]) == {"O2"}
    assert "centers" in results["step.loss_tensors"].issues[0].message


def test_the_full_default_preflight_restores_tensors_outside_the_model():
    torch.manual_seed(0)
    model = ScaledMLP()
    criterion = CenterLoss()
    optimizer = torch.optim.AdamW([*model.parameters(), model.scale, *criterion.parameters()], lr=1e-2)
    scale, centers = model.scale.detach().clone(), criterion.centers.detach().clone()
    report = run_preflight(model, optimizer, loader(), loss_fn=criterion)
    assert ("model.unregistered_tensors", "PARAM_UNREGISTERED", "warning") in loud(report)
    assert not any(name in ("step.loss_tensors", "model.optimizer_params") for name, _, _ in loud(report))
    assert torch.equal(model.scale.detach(), scale) and torch.equal(criterion.centers.detach(), centers)
    assert model.scale.grad is None and criterion.centers.grad is None and not optimizer.state


def test_a_healthy_batchnorm_cnn_passes_the_full_default_preflight_quietly():
    from optimus_preflight.training.optim import weight_decay_groups

    generator = torch.Generator().manual_seed(0)
    images = (torch.rand(160, 3, 12, 12, generator=generator) - 0.45) / 0.25
    labels = torch.randint(0, CLASSES, (160,), generator=generator)
    train, val = torch.utils.data.random_split(TensorDataset(images, labels), [0.8, 0.2],
                                               generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, CLASSES))
    optimizer = torch.optim.AdamW(weight_decay_groups(cnn, 0.01, decay_bias_and_norm=False), lr=1e-3)
    report = run_preflight(cnn, optimizer, DataLoader(train, batch_size=16, shuffle=True, drop_last=True),
                           val_loader=DataLoader(val, batch_size=16), loss_fn=nn.CrossEntropyLoss())
    assert loud(report) == []


def test_ties_from_output_and_input_embeddings_where_the_model_declares_no_mapping():
    """Older transformers declare ties by tie_word_embeddings and the embedding getters."""
    from types import SimpleNamespace

    from optimus_preflight.preflight.checks.tied_embeddings import declared_ties, untied_pairs

    class OldStyleLM(nn.Module):
        def __init__(self, tie: bool):
            super().__init__()
            self.config = SimpleNamespace(tie_word_embeddings=tie, to_dict=dict)
            self.embed = nn.Embedding(VOCAB, 8)
            self.head = nn.Linear(8, VOCAB, bias=False)

        def get_input_embeddings(self):
            return self.embed

        def get_output_embeddings(self):
            return self.head

    assert declared_ties(OldStyleLM(tie=False)) == []
    untied = OldStyleLM(tie=True)
    assert declared_ties(untied) == [("head.weight", "embed.weight")]
    assert untied_pairs(untied) == [("head.weight", "embed.weight", False)]
    untied.head.weight = untied.embed.weight  # what tie_weights() does
    assert untied_pairs(untied) == []


class ScaledAfterRequiresGrad(nn.Module):
    """The scale applied after requires_grad=True: the attribute is a product, not a leaf."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))
        self.bias = torch.zeros(CLASSES, requires_grad=True) * 0.01

    def forward(self, x):
        return self.net(x) + self.bias


def test_a_learnable_tensor_scaled_after_requires_grad_is_an_orphan():
    model = ScaledAfterRequiresGrad()
    report = preflight(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert loud(report) == [("model.unregistered_tensors", "PARAM_UNREGISTERED", "error")]
    issue = issue_of(report, "model.unregistered_tensors")
    assert "bias (computed from a tensor with requires_grad: MulBackward0)" in issue.message
    assert "nn.Parameter(torch.randn(n) * 0.01)" in issue.fix


def test_an_activation_cached_by_a_forward_is_not_an_orphan():
    class KeepsLastLogits(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))
            self.last = None

        def forward(self, x):
            self.last = self.net(x)  # kept for inspection, attached to the graph
            return self.last

    model = KeepsLastLogits()
    model(torch.randn(2, FEATURES))  # a sanity forward before the preflight
    assert loud(preflight(model, torch.optim.SGD(model.parameters(), lr=0.1))) == []


# ---------------------------------------------------------------- what the gradient really reaches
GRADIENTS = (FirstBatchCheck, FirstStepCheck, GradientsCheck)


def test_a_data_term_turned_into_a_number_leaves_only_the_penalty_training():
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))

    def penalised(as_number):
        def loss_fn(model, batch):
            inputs, targets = batch
            data_term = F.cross_entropy(model(inputs), targets)
            penalty = 1e-3 * sum(p.pow(2).sum() for p in model.parameters())
            return (data_term.item() if as_number else data_term) + penalty
        return loss_fn

    report = preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=penalised(True), checks=GRADIENTS)
    assert loud(report) == [("step.gradients", "LOSS_NOT_FROM_OUTPUT", "error")]
    assert ".item()" in issue_of(report, "step.gradients").message
    report = preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=penalised(False), checks=GRADIENTS)
    assert loud(report) == []


class BinaryCodes(nn.Module):
    """A hashing autoencoder: 8-bit codes between an encoder and a decoder."""

    def __init__(self, straight_through: bool):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 8))
        self.decoder = nn.Linear(8, CLASSES)
        self.straight_through = straight_through

    def forward(self, x):
        soft = torch.sigmoid(self.encoder(x))
        hard = torch.round(soft)
        return self.decoder(soft + (hard - soft).detach() if self.straight_through else hard)


def test_a_round_without_straight_through_gives_the_encoder_zero_gradients():
    torch.manual_seed(0)
    model = BinaryCodes(straight_through=False)
    report = preflight(model, torch.optim.Adam(model.parameters(), lr=1e-3), checks=GRADIENTS)
    assert loud(report) == [("step.gradients", "GRAD_ZERO", "error")]
    issue = issue_of(report, "step.gradients")
    assert "torch.round" in issue.message and "encoder.0.weight" in issue.message and "straight-through" in issue.fix
    model = BinaryCodes(straight_through=True)
    assert loud(preflight(model, torch.optim.Adam(model.parameters(), lr=1e-3), checks=GRADIENTS)) == []


def test_predictions_rounded_inside_the_loss_name_the_round():
    """Every gradient 0, not only the encoder's: the rounding sits on the model's output."""
    torch.manual_seed(0)
    model = nn.Linear(FEATURES, 1)

    def rounded(model, batch):
        x, y = batch
        return F.mse_loss(torch.round(model(x).squeeze(-1)), y.float())

    report = preflight(model, torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=rounded, checks=GRADIENTS)
    assert loud(report) == [("step.gradients", "GRAD_ZERO", "error")]
    issue = issue_of(report, "step.gradients")
    assert "every gradient of the first step is exactly zero" in issue.message and "torch.round" in issue.message


class CheckpointedBlocks(nn.Module):
    def __init__(self, reentrant: bool):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.ReLU()) for _ in range(2)])
        self.head = nn.Linear(FEATURES, CLASSES)
        self.reentrant = reentrant

    def forward(self, x):
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


def test_reentrant_checkpointing_of_inputs_without_grad_is_named():
    torch.manual_seed(0)
    model = CheckpointedBlocks(reentrant=True)
    report = preflight(model, torch.optim.Adam(model.parameters(), lr=1e-3), checks=GRADIENTS)
    assert loud(report) == [("step.gradients", "GRAD_NONE", "error")]
    issue = issue_of(report, "step.gradients")
    assert "blocks.0.0.weight" in issue.message and "use_reentrant=False" in issue.fix
    model = CheckpointedBlocks(reentrant=False)
    assert loud(preflight(model, torch.optim.Adam(model.parameters(), lr=1e-3), checks=GRADIENTS)) == []


# ---------------------------------------------------------------- dropout left on in eval mode
class ModelessDropout(nn.Module):
    """F.dropout(h, p) without training=: the functional form drops in eval mode too."""

    def __init__(self, pass_mode: bool):
        super().__init__()
        self.body, self.head = nn.Linear(FEATURES, 16), nn.Linear(16, CLASSES)
        self.pass_mode = pass_mode

    def forward(self, x):
        hidden = torch.relu(self.body(x))
        hidden = F.dropout(hidden, 0.2, training=self.training) if self.pass_mode else F.dropout(hidden, 0.2)
        return self.head(hidden)


def test_functional_dropout_without_the_modules_mode_is_active_in_eval():
    torch.manual_seed(0)
    model = ModelessDropout(pass_mode=False)
    report = preflight(model, torch.optim.Adam(model.parameters(), lr=1e-3), checks=(FirstBatchCheck, DropoutInEvalCheck))
    assert loud(report) == [("model.dropout_in_eval", "DROPOUT_IN_EVAL", "warning")]
    issue = issue_of(report, "model.dropout_in_eval")
    assert "ModelessDropout (p=0.2)" in issue.message and "training=self.training" in issue.fix
    assert model.training  # the mode is restored


class HandWrittenDropouts(nn.Module):
    """Modality dropout and stochastic depth written with torch.rand, optionally gated on the mode;
    a VAE-style sample with randn is sampling on purpose."""

    def __init__(self, gated: bool):
        super().__init__()
        self.a, self.b = nn.Linear(FEATURES, 16), nn.Linear(FEATURES, 16)
        self.block, self.head = nn.Linear(32, 32), nn.Linear(32, CLASSES)
        self.gated = gated

    def forward(self, x):
        ha, hb = self.a(x), self.b(x)
        if (self.training or not self.gated) and torch.rand((), device=x.device) < 0.3:  # modality dropout
            keep = (torch.rand(x.shape[0], 1, device=x.device) < 0.5).float()
            ha, hb = ha * keep, hb * (1 - keep)
        h = torch.cat([ha, hb], 1)
        h = h + 0.01 * torch.randn_like(h)  # noise on purpose, no decision
        return self.head(h + self.block(h))


@pytest.mark.parametrize("gated", [False, True])
def test_a_hand_written_random_mask_in_eval_mode(gated):
    torch.manual_seed(0)
    model = HandWrittenDropouts(gated)
    report = preflight(model, torch.optim.Adam(model.parameters(), lr=1e-3), checks=(FirstBatchCheck, DropoutInEvalCheck))
    if gated:
        assert loud(report) == []
        return
    assert loud(report) == [("model.dropout_in_eval", "DROPOUT_IN_EVAL", "warning")]
    issue = issue_of(report, "model.dropout_in_eval")
    assert "torch.rand((), device=x.device) < 0.3" in issue.message and "if self.training" in issue.fix


@pytest.mark.parametrize("build", [lambda: ModelessDropout(pass_mode=True), lambda: mlp_with_dropout(0.5)])
def test_dropout_that_follows_the_mode_is_quiet_in_eval(build):
    torch.manual_seed(0)
    model = build()
    report = preflight(model, torch.optim.Adam(model.parameters(), lr=1e-3), checks=(FirstBatchCheck, DropoutInEvalCheck))
    assert loud(report) == []
