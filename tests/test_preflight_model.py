"""Model/optimizer wiring checks: each fires on a deliberately miswired setup."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from optimus_preflight.preflight.checks.model_checks import (
    ModesCheck,
    OptimizerEpsCheck,
    OptimizerParamsCheck,
    WeightDecayCheck,
)
from optimus_preflight.preflight.framework import CheckStatus
from tests.preflight_support import CLASSES, FEATURES, assert_quiet, classifier, codes, plain_context, run

WIRING = (OptimizerParamsCheck, ModesCheck, WeightDecayCheck, OptimizerEpsCheck)


def test_healthy_wiring_is_quiet(tmp_path):
    for result in run(plain_context(tmp_path), *WIRING).values():
        assert_quiet(result)


def test_trainable_params_missing_from_the_optimizer(tmp_path):
    ctx = plain_context(tmp_path, optimizer=lambda m: torch.optim.AdamW(m[0].parameters()))
    result = run(ctx, OptimizerParamsCheck)["model.optimizer_params"]
    assert codes(result) == {"O2"} and result.status == CheckStatus.ERROR
    assert "2.weight" in result.issues[0].message
    # the optimizer holds exactly one submodule's parameters: it was built from that submodule
    assert "built from model.0.parameters()" in result.issues[0].message


def test_an_optimizer_over_a_slice_of_one_layer_is_not_said_to_be_built_from_a_submodule(tmp_path):
    ctx = plain_context(tmp_path, optimizer=lambda m: torch.optim.AdamW([m[0].weight]))
    result = run(ctx, OptimizerParamsCheck)["model.optimizer_params"]
    assert codes(result) == {"O2"} and "built from model." not in result.issues[0].message


def test_optimizer_holding_tensors_that_are_not_the_models(tmp_path):
    ctx = plain_context(tmp_path, optimizer=lambda m: torch.optim.AdamW(classifier().parameters()))
    result = run(ctx, OptimizerParamsCheck)["model.optimizer_params"]
    assert codes(result) == {"O2"} and result.data["foreign"] == 4


def test_frozen_params_left_in_the_optimizer(tmp_path):
    def freeze_after_building(model):
        optimizer = torch.optim.AdamW(model.parameters())
        model[0].requires_grad_(False)
        return optimizer

    result = run(plain_context(tmp_path, optimizer=freeze_after_building), OptimizerParamsCheck)["model.optimizer_params"]
    assert codes(result) == {"O17"} and result.issues[0].severity.value == "info"  # skipped while without a grad
    assert "0.weight" in result.issues[0].message

    def freeze_holding_a_gradient(model):
        optimizer = torch.optim.AdamW(model.parameters(), weight_decay=0.1)
        model[0].weight.grad = torch.zeros_like(model[0].weight)  # zero_grad(set_to_none=False) after a step
        model[0].requires_grad_(False)
        return optimizer

    result = run(plain_context(tmp_path, optimizer=freeze_holding_a_gradient), OptimizerParamsCheck)["model.optimizer_params"]
    assert codes(result) == {"O17"} and result.status == CheckStatus.WARNING
    assert "0.weight still hold a .grad" in result.issues[0].message


def test_a_param_in_two_groups(tmp_path):
    def two_groups(model):
        optimizer = torch.optim.AdamW(model.parameters())
        # torch refuses this in the constructor; appending to param_groups slips past it.
        optimizer.param_groups.append({**optimizer.defaults, "params": [model[0].weight]})
        return optimizer

    result = run(plain_context(tmp_path, optimizer=two_groups), OptimizerParamsCheck)["model.optimizer_params"]
    assert codes(result) == {"OPT_DUPLICATE_PARAM"}


class KeepsDropoutOff(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = classifier()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.body(self.drop(x))

    def train(self, mode=True):
        super().train(mode)
        self.drop.eval()  # the bug: dropout never runs in training
        return self


class AlwaysEval(KeepsDropoutOff):
    def train(self, mode=True):
        return super().train(False)


@pytest.mark.parametrize("model", [KeepsDropoutOff, AlwaysEval])
def test_modules_stuck_in_eval_mode(tmp_path, model):
    result = run(plain_context(tmp_path, model=model), ModesCheck)["model.modes"]
    assert codes(result) == {"O5"} and result.status == CheckStatus.WARNING


class Distiller(nn.Module):
    """A student beside a teacher kept in eval mode by train(): frozen (the distillation setup), or
    trainable (the same override on a part that trains)."""

    def __init__(self, frozen_teacher: bool):
        super().__init__()
        self.student = classifier()
        self.teacher = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.Linear(16, 3))
        self.teacher.requires_grad_(not frozen_teacher)

    def forward(self, x):
        return self.student(x)

    def train(self, mode=True):
        super().train(mode)
        self.teacher.eval()
        return self


@pytest.mark.parametrize("frozen_teacher", [True, False])
def test_dropout_off_in_a_frozen_teacher_is_the_design(tmp_path, frozen_teacher):
    result = run(plain_context(tmp_path, model=lambda: Distiller(frozen_teacher)), ModesCheck)["model.modes"]
    assert (codes(result) == {"O5"}) == (not frozen_teacher)


class FrozenBackbone(nn.Module):
    def __init__(self, keep_frozen_norm_in_eval: bool):
        super().__init__()
        self.keep = keep_frozen_norm_in_eval
        self.backbone = nn.Sequential(nn.Linear(FEATURES, 8), nn.BatchNorm1d(8))
        self.backbone.requires_grad_(False)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x):
        return self.head(self.backbone(x))

    def train(self, mode=True):
        super().train(mode)
        if self.keep:
            self.backbone[1].eval()  # the O18 fix
        return self


@pytest.mark.parametrize("fixed", [False, True])
def test_frozen_batchnorm_in_train_mode(tmp_path, fixed):
    result = run(plain_context(tmp_path, model=lambda: FrozenBackbone(fixed)), ModesCheck)["model.modes"]
    if fixed:
        assert_quiet(result)
    else:
        assert codes(result) == {"O18"} and "backbone.1" in result.issues[0].message


class MomentumEncoder(nn.Module):
    """MoCo / BYOL: a frozen key network that copies the query network and follows it by EMA;
    its BatchNorm normalises with batch statistics in train mode by design."""

    def __init__(self, twin: bool):
        super().__init__()
        self.query = nn.Sequential(nn.Linear(FEATURES, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, CLASSES))
        width = 8 if twin else 12  # not a twin: a frozen network of its own, whose statistics do drift
        self.key = nn.Sequential(nn.Linear(FEATURES, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, CLASSES))
        self.key.requires_grad_(False)

    def forward(self, x):
        return self.query(x) + self.key(x).detach()


@pytest.mark.parametrize("twin", [True, False], ids=["momentum_copy_of_the_query", "frozen_network_of_its_own"])
def test_a_momentum_copy_normalising_with_batch_statistics_is_quiet(tmp_path, twin):
    result = run(plain_context(tmp_path, model=lambda: MomentumEncoder(twin)), ModesCheck)["model.modes"]
    if twin:
        assert_quiet(result)
    else:
        assert codes(result) == {"O18"} and "key.1" in result.issues[0].message


def test_adam_with_weight_decay_suggests_adamw(tmp_path):
    ctx = plain_context(tmp_path, optimizer=lambda m: torch.optim.Adam(m.parameters(), weight_decay=0.01))
    result = run(ctx, WeightDecayCheck)["model.weight_decay"]
    # Adam's coupled decay, and (one group for everything) decay on the biases.
    assert codes(result) == {"O6"} and len(result.issues) == 2
    assert any("AdamW" in issue.fix for issue in result.issues)


def test_weight_decay_on_biases_and_norm_weights(tmp_path):
    ctx = plain_context(tmp_path, "optimizer.decay_bias_and_norm=true")
    result = run(ctx, WeightDecayCheck)["model.weight_decay"]
    assert codes(result) == {"O6"} and result.issues[0].config_key == "optimizer.decay_bias_and_norm"
    assert "0.bias" in result.issues[0].message


@pytest.mark.parametrize(("dtype", "eps", "fires"), [
    (torch.float16, 1e-8, True),    # 1e-8 is 0 in fp16: zero gradients give 0/0
    (torch.float16, 1e-4, False),
    (torch.bfloat16, 1e-8, False),  # representable in bf16: a trial step stays finite
    (torch.float32, 1e-8, False),
])
def test_adamw_eps_for_half_precision_state(tmp_path, dtype, eps, fires):
    ctx = plain_context(tmp_path, f"optimizer.eps={eps}", model=lambda: classifier().to(dtype))
    result = run(ctx, OptimizerEpsCheck)["model.optimizer_eps"]
    if fires:
        assert codes(result) == {"O10"} and result.issues[0].config_key == "optimizer.eps"
    else:
        assert_quiet(result)


def test_a_frozen_pretrained_embedding_handed_to_the_optimizer_names_from_pretrained():
    from torch.utils.data import DataLoader, TensorDataset

    from optimus_preflight.preflight import run_preflight
    from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck

    vectors = torch.randn(100, 8) * 0.4
    for freeze, fires in ((True, True), (False, False)):
        model = nn.Sequential(nn.Embedding.from_pretrained(vectors, freeze=freeze), nn.Flatten(), nn.Linear(40, 2))
        report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                               DataLoader(TensorDataset(torch.randint(0, 100, (64, 5)), torch.randint(0, 2, (64,))),
                                          batch_size=16),
                               loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), OptimizerParamsCheck()])
        found = [i for i in report.check("model.optimizer_params").issues if i.code == "O17"]
        assert bool(found) == fires
        if found:
            assert found[0].severity.value == "warning" and "freeze=False" in found[0].fix


def test_a_sinusoidal_position_table_the_model_froze_itself_is_quiet():
    """Whisper and Marian build embed_positions as sin/cos tables with requires_grad=False:
    model.parameters() hands them to the optimizer, and that is no mistake."""
    import math

    from torch.utils.data import DataLoader, TensorDataset

    from optimus_preflight.preflight import run_preflight
    from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
    from optimus_preflight.preflight.checks.model_checks import sinusoidal_table

    positions, dim = 5, 8
    angle = torch.arange(positions)[:, None] / 10000 ** (torch.arange(dim // 2)[None] / (dim // 2))
    halves = torch.cat([angle.sin(), angle.cos()], dim=1)
    interleaved = torch.stack([angle.sin(), angle.cos()], dim=2).flatten(1)
    assert sinusoidal_table(halves) and sinusoidal_table(interleaved)
    assert not sinusoidal_table(torch.randn(positions, dim)) and not sinusoidal_table(halves * 0.5)

    class Tagger(nn.Module):
        def __init__(self, table):
            super().__init__()
            self.tokens = nn.Embedding(100, dim)
            self.embed_positions = nn.Embedding(positions, dim)
            self.embed_positions.weight.data.copy_(table)
            self.embed_positions.requires_grad_(False)
            self.head = nn.Linear(positions * dim, 2)

        def forward(self, ids):
            return self.head((self.tokens(ids) + self.embed_positions.weight).flatten(1) / math.sqrt(dim))

    for table, fires in ((halves, False), (interleaved, False), (torch.randn(positions, dim) * 0.4, True)):
        model = Tagger(table)
        report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                               DataLoader(TensorDataset(torch.randint(0, 100, (64, positions)),
                                                        torch.randint(0, 2, (64,))), batch_size=16),
                               loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), OptimizerParamsCheck()])
        warned = [i for i in report.check("model.optimizer_params").issues
                  if i.code == "O17" and i.severity.value == "warning"]
        assert bool(warned) == fires


class Encoded(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(FEATURES, width), nn.ReLU())
        self.head = nn.Linear(width, CLASSES)


class Distillation(nn.Module):
    def __init__(self):
        super().__init__()
        self.teacher, self.student = Encoded(32), Encoded(16)


@pytest.mark.parametrize("freeze, fires", [("'encoder' in name", True), ("name.startswith('teacher.')", False),
                                           ("student encoder on purpose, optimizer without it", False)])
def test_a_freeze_by_name_match_that_also_catches_the_student(tmp_path, freeze, fires):
    """Freezing the teacher with ``'encoder' in name`` also freezes ``student.encoder``, which the
    optimizer (built from the student) was meant to train."""
    def frozen_model() -> nn.Module:
        model = Distillation()
        for name, param in model.named_parameters():
            if (freeze == "'encoder' in name" and "encoder" in name) or name.startswith("teacher."):
                param.requires_grad = False
        if freeze.startswith("student encoder"):
            model.student.encoder.requires_grad_(False)
        return model

    def optimizer(model: nn.Module) -> torch.optim.Optimizer:
        trained = model.student.head if freeze.startswith("student encoder") else model.student
        return torch.optim.AdamW(trained.parameters())

    ctx = plain_context(tmp_path, model=frozen_model, optimizer=optimizer)
    result = run(ctx, OptimizerParamsCheck)["model.optimizer_params"]
    warned = [i for i in result.issues if i.code == "O17" and i.severity.value == "warning"]
    assert bool(warned) == fires, result.issues
    if fires:
        assert "'encoder'" in warned[0].message and "student.encoder" in warned[0].message
        assert "model.teacher.requires_grad_(False)" in warned[0].fix


class CategoryModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stores, self.head = nn.Embedding(400, 8), nn.Linear(8, CLASSES)


@pytest.mark.parametrize("optimizer, fires", [("adam_decay_all", True), ("adamw", False), ("adam_tables_excluded", False)])
def test_adam_coupled_decay_on_an_embedding_table_erases_rare_rows(tmp_path, optimizer, fires):
    def build(model):
        if optimizer == "adamw":
            return torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=1e-2)
        if optimizer == "adam_tables_excluded":
            return torch.optim.Adam([{"params": model.head.parameters(), "weight_decay": 1e-2},
                                     {"params": model.stores.parameters(), "weight_decay": 0.0}], lr=5e-3)
        return torch.optim.Adam(model.parameters(), lr=5e-3, weight_decay=1e-2)

    result = run(plain_context(tmp_path, model=CategoryModel, optimizer=build), WeightDecayCheck)["model.weight_decay"]
    warned = [i for i in result.issues if i.code == "O6" and i.severity.value == "warning"]
    assert bool(warned) == fires
    if fires:
        assert "stores.weight" in warned[0].message and "full step of about lr = " in warned[0].message
        assert "AdamW" in warned[0].fix and "'weight_decay': 0.0" in warned[0].fix


def test_a_head_replaced_after_the_optimizer_was_built_is_named_as_replaced(tmp_path):
    def replace_head_after_building(model):
        optimizer = torch.optim.AdamW(model.parameters())
        model[2] = nn.Linear(model[2].in_features, CLASSES)
        return optimizer

    ctx = plain_context(tmp_path, optimizer=replace_head_after_building)
    result = run(ctx, OptimizerParamsCheck)["model.optimizer_params"]
    (issue,) = result.issues
    assert issue.code == "O2" and "'2' was replaced after the optimizer was built" in issue.message
    assert "built from model." not in issue.message and result.data["foreign"] == 2
