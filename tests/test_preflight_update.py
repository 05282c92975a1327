"""``step.update``: what the first real optimizer step did to the weights, through
``run_preflight``. Each broken optimizer setting is written the way users write it (a
lost exponent, copied advice, a flag from reward code, a custom step), beside healthy
settings of the same optimizers that must stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.update_audit import GroupStep, update_findings
from optimus_preflight.preflight.checks.config_checks import LrScheduleCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.checks.update_checks import UpdateCheck
from optimus_preflight.preflight.framework import Severity


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 4))


def images() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(128, 3, 12, 12, generator=generator)
    y = x[:, 0].mean(dim=(1, 2)).gt(0).long() + 2 * x[:, 1].mean(dim=(1, 2)).gt(0).long()
    return DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)


def tabular() -> tuple[nn.Module, DataLoader]:
    torch.manual_seed(0)
    x = torch.randn(256, 10, generator=torch.Generator().manual_seed(1))
    y = x[:, :3].sum(dim=1) + 0.1 * torch.randn(256, generator=torch.Generator().manual_seed(2))
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))
    return model, DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)


def found(report) -> dict[str, object]:
    return {issue.code: issue for _, issue in report.issues() if issue.severity != Severity.INFO}


def audit(model, optimizer, loader, loss_fn=None, **kwargs):
    return run_preflight(model, optimizer, loader, loss_fn=loss_fn or nn.CrossEntropyLoss(), **kwargs,
                         checks=[FirstBatchCheck(), FirstStepCheck(), UpdateCheck(), LrScheduleCheck()])


class ZeroGradFirstSGD(torch.optim.SGD):
    """A 'clean' SGD that clears the gradients at the start of step instead of after it."""

    def step(self, closure=None):
        self.zero_grad()
        return super().step(closure)


class PlusSGD(torch.optim.Optimizer):
    """A hand-written SGD whose update adds the gradient."""

    def __init__(self, params, lr=0.05):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=group["lr"])


# ---------------------------------------------------------------- fires
def test_weight_decay_with_its_exponent_lost_is_an_error():
    model = cnn()
    report = audit(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5), images())
    issue = found(report)["UPDATE_WEIGHT_DECAY"]
    assert issue.severity == Severity.ERROR and "weight_decay=5" in issue.message and "by 25." in issue.message
    assert "exponent" in issue.fix


def test_coupled_adam_decay_that_swamps_the_gradient_is_reported():
    model, data = tabular()
    report = audit(model, torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=50.0), data, nn.MSELoss())
    assert "UPDATE_WEIGHT_DECAY" in found(report)


def test_an_adam_eps_far_above_the_gradients_is_a_warning():
    model, data = tabular()
    report = audit(model, torch.optim.Adam(model.parameters(), lr=1e-3, eps=1.0), data, nn.MSELoss())
    issue = found(report)["UPDATE_EPS"]
    assert issue.severity == Severity.WARNING and "eps=1" in issue.message and "1e-8" in issue.fix


@pytest.mark.parametrize("optimizer", [lambda p: torch.optim.Adam(p, lr=1e-3, maximize=True),
                                       lambda p: torch.optim.SGD(p, lr=0.05, maximize=True)])
def test_maximize_true_climbs_the_loss(optimizer):
    model = cnn()
    issue = found(audit(model, optimizer(model.parameters()), images()))["UPDATE_ASCENT"]
    assert issue.severity == Severity.ERROR and "maximize=True" in issue.message


def test_a_hand_written_step_that_adds_the_gradient_climbs_the_loss():
    model = cnn()
    issue = found(audit(model, PlusSGD(model.parameters()), images()))["UPDATE_ASCENT"]
    assert "adds the gradient" in issue.message and "maximize" not in issue.message


def test_a_step_that_clears_the_gradients_first_changes_nothing():
    model = cnn()
    issue = found(audit(model, ZeroGradFirstSGD(model.parameters(), lr=0.05), images()))["UPDATE_NONE"]
    assert issue.severity == Severity.ERROR and "zero_grad()" in issue.message


def test_clipping_at_a_weight_decay_sized_norm_is_a_warning():
    model = cnn()
    report = audit(model, torch.optim.SGD(model.parameters(), lr=0.05), images(), clip_grad_norm=1e-4)
    issue = found(report)["UPDATE_CLIPPED"]
    assert "clip_grad_norm=0.0001" in issue.message and "clip_grad_norm=1.0" in issue.fix


def test_a_new_head_group_that_inherits_lr_zero_is_a_warning_naming_it():
    model = cnn()
    groups = [{"params": [p for n, p in model.named_parameters() if not n.startswith("5.")], "lr": 1e-4},
              {"params": model[5].parameters()}]
    report = audit(model, torch.optim.AdamW(groups, lr=0.0), images())
    issue = found(report)["O8"]
    assert issue.severity == Severity.WARNING and "5.weight" in issue.message and "group(s) 1" in issue.message
    assert "UPDATE_NONE" not in found(report)  # the other group moved


def test_a_zero_base_lr_under_a_scheduler_is_a_warning_too():
    model = cnn()
    groups = [{"params": [p for n, p in model.named_parameters() if not n.startswith("5.")], "lr": 1e-3},
              {"params": model[5].parameters(), "lr": 0.0}]
    optimizer = torch.optim.AdamW(groups)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    issue = found(audit(model, optimizer, images(), scheduler=scheduler, max_steps=50))["O8"]
    assert "as the base the scheduler scales" in issue.message and "5.bias" in issue.message


# ---------------------------------------------------------------- stays quiet
HEALTHY = {
    "sgd momentum, decay 5e-4": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=5e-4),
    "adamw 0.05 decay": lambda p: torch.optim.AdamW(p, lr=3e-4, weight_decay=0.05),
    "adam, coupled 1e-4 decay": lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=1e-4),
    "adam eps 1e-6": lambda p: torch.optim.Adam(p, lr=1e-3, eps=1e-6),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-3),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
    "nadam": lambda p: torch.optim.NAdam(p, lr=2e-3),
    "radam decoupled": lambda p: torch.optim.RAdam(p, lr=1e-3, weight_decay=0.01, decoupled_weight_decay=True),
}


@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_healthy_optimizers_are_quiet(name):
    model = cnn()
    report = audit(model, HEALTHY[name](model.parameters()), images(), clip_grad_norm=1.0)
    assert not {code for code in found(report) if code.startswith("UPDATE") or code == "O8"}


def test_a_tiny_sgd_step_is_not_a_step_that_changes_nothing():
    # lr=1e-6: each step is too small for the dtype to record on many weights; that is no
    # UPDATE_NONE (step() did not discard the gradients). Whether the whole run can move
    # the weights is UPDATE_TOO_SMALL's business (test_preflight_update_too_small.py).
    model = cnn()
    report = audit(model, torch.optim.SGD(model.parameters(), lr=1e-6), images(), clip_grad_norm=1.0)
    assert not {code for code in found(report) if code in ("UPDATE_NONE", "UPDATE_UNDONE", "O8")}


def test_a_warmup_that_starts_near_zero_is_not_a_step_that_changes_nothing():
    model = cnn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1e-9, total_iters=20)
    report = audit(model, optimizer, images(), scheduler=scheduler, max_steps=100)
    assert not {code for code in found(report) if code.startswith("UPDATE")}


def test_a_scaler_skipped_step_and_a_frozen_model_part_are_not_audited():
    model = cnn()
    model[0].requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05, momentum=0.9)
    assert not {code for code in found(audit(model, optimizer, images())) if code.startswith("UPDATE")}


# ---------------------------------------------------------------- the analysis alone
def step(before, grad, after, **settings) -> GroupStep:
    lr = settings.pop("lr", 0.1)
    return GroupStep(0, ["w"], lr, settings, torch.tensor(before), torch.tensor(grad), torch.tensor(after))


def test_the_analysis_names_what_it_sees():
    w, g = [0.5, -0.2, 0.1, 0.3], [0.1, 0.2, -0.1, 0.05]
    descent = step(w, g, [a - 0.1 * b for a, b in zip(w, g)])
    assert update_findings([descent], optimizer_name="SGD", grad_norm=1.0, clip_grad_norm=None) == []
    ascent = step(w, g, [a + 0.1 * b for a, b in zip(w, g)])
    assert [f.code for f in update_findings([ascent], optimizer_name="SGD", grad_norm=1.0, clip_grad_norm=None)] == [
        "UPDATE_ASCENT"]
    unchanged = step(w, g, w)
    assert [f.code for f in update_findings([unchanged], optimizer_name="SGD", grad_norm=1.0, clip_grad_norm=None)] == [
        "UPDATE_NONE"]
    # lr so small that fp32 cannot record the step: nothing to say
    assert update_findings([step(w, g, w, lr=1e-12)], optimizer_name="SGD", grad_norm=1.0, clip_grad_norm=None) == []
    shrink = step(w, g, [0.7 * a for a in w], weight_decay=3.0)
    assert [f.code for f in update_findings([shrink], optimizer_name="SGD", grad_norm=1.0, clip_grad_norm=None)] == [
        "UPDATE_WEIGHT_DECAY"]
    assert [f.code for f in update_findings([descent], optimizer_name="SGD", grad_norm=5.0, clip_grad_norm=1e-4)] == [
        "UPDATE_CLIPPED"]
    assert update_findings([descent], optimizer_name="SGD", grad_norm=5000.0, clip_grad_norm=1.0) == []


def test_functional_losses_and_the_audit_together_on_a_seq2seq_model():
    """A GRU encoder-decoder with teacher forcing: a healthy AdamW stays quiet, eps=0.5 fires."""
    torch.manual_seed(0)

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(20, 16)
            self.encoder = nn.GRU(16, 32, batch_first=True)
            self.decoder = nn.GRU(16, 32, batch_first=True)
            self.out = nn.Linear(32, 20)

        def forward(self, source, decoder_input):
            _, state = self.encoder(self.embed(source))
            output, _ = self.decoder(self.embed(decoder_input), state)
            return self.out(output)

    source = torch.randint(1, 20, (64, 7), generator=torch.Generator().manual_seed(0))
    target = source.flip(1)
    decoder_input = torch.cat([torch.zeros(64, 1, dtype=torch.long), target[:, :-1]], dim=1)
    data = DataLoader(TensorDataset(source, decoder_input, target), batch_size=16, shuffle=True)

    def loss(model, batch):
        src, dec, tgt = batch
        return F.cross_entropy(model(src, dec).flatten(0, 1), tgt.flatten())

    quiet = Seq2Seq()
    assert not found(audit(quiet, torch.optim.AdamW(quiet.parameters(), lr=1e-3), data, loss))
    broken = Seq2Seq()
    assert "UPDATE_EPS" in found(audit(broken, torch.optim.AdamW(broken.parameters(), lr=1e-3, eps=0.5), data, loss))


# ---------------------------------------------------------------- symmetric initialisation
def constant_init(model: nn.Module, value: float = 0.05) -> nn.Module:
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.constant_(module.weight, value)
            nn.init.zeros_(module.bias)
    return model


def test_constant_initialisation_of_every_layer_is_symmetric():
    model, data = tabular()
    report = audit(constant_init(model), torch.optim.Adam(model.parameters(), lr=1e-3), data, nn.MSELoss())
    issue = found(report)["INIT_SYMMETRIC"]
    assert "0.weight" in issue.message and "kaiming" in issue.fix
    model = constant_init(cnn(), 0.01)
    assert "INIT_SYMMETRIC" in found(audit(model, torch.optim.SGD(model.parameters(), lr=0.05), images()))


def test_an_all_zero_initialisation_is_named_as_zeros():
    model, data = tabular()
    report = audit(constant_init(model, 0.0), torch.optim.Adam(model.parameters(), lr=1e-3), data, nn.MSELoss())
    issue = found(report)["INIT_SYMMETRIC"]
    assert "initialised to zero (nn.init.zeros_)" in issue.message and "constant_" not in issue.message


class BprWithUserBias(nn.Module):
    """Matrix factorisation with zero-initialised user and item bias tables, trained by BPR: the
    user's bias cancels in s(u, i+) - s(u, i-), so its table keeps a zero gradient by design."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.user, self.item = nn.Embedding(50, 8), nn.Embedding(80, 8)
        self.user_bias, self.item_bias = nn.Embedding(50, 1), nn.Embedding(80, 1)
        nn.init.zeros_(self.user_bias.weight)
        nn.init.zeros_(self.item_bias.weight)

    def forward(self, users, items):
        return (self.user(users) * self.item(items)).sum(-1) + self.user_bias(users)[:, 0] + self.item_bias(items)[:, 0]


def test_a_zero_bias_table_the_loss_cancels_is_not_symmetric():
    g = torch.Generator().manual_seed(0)
    triples = torch.stack([torch.randint(0, 50, (256,), generator=g), torch.randint(0, 80, (256,), generator=g),
                           torch.randint(0, 80, (256,), generator=g)], 1)

    def bpr(model, batch):
        (t,) = batch
        return -F.logsigmoid(model(t[:, 0], t[:, 1]) - model(t[:, 0], t[:, 2])).mean()

    model = BprWithUserBias()
    assert "INIT_SYMMETRIC" not in found(audit(model, torch.optim.Adam(model.parameters(), lr=1e-2),
                                               DataLoader(TensorDataset(triples), batch_size=32, shuffle=True), bpr))


class LoraLinear(nn.Module):
    """A frozen base weight plus a low-rank update whose B starts at zero."""

    def __init__(self, base: nn.Linear, rank: int = 4):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + x @ self.a.t() @ self.b.t()


def test_zero_initialised_heads_and_lora_are_not_symmetric():
    model = cnn()
    nn.init.zeros_(model[5].weight)  # a zero-init classifier head
    assert not found(audit(model, torch.optim.AdamW(model.parameters(), lr=1e-3), images()))
    torch.manual_seed(0)
    lora = nn.Sequential(LoraLinear(nn.Linear(10, 32)), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))
    _, data = tabular()
    trainable = [p for p in lora.parameters() if p.requires_grad]
    assert not found(audit(lora, torch.optim.AdamW(trainable, lr=1e-3), data, nn.MSELoss()))


def test_adam_betas_in_the_wrong_order_are_a_warning():
    model, data = tabular()
    issue = found(audit(model, torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.999, 0.9)), data,
                        nn.MSELoss()))["UPDATE_BETAS"]
    assert "betas=(0.999, 0.9)" in issue.message and "betas=(0.9, 0.999)" in issue.fix
    for betas in [(0.9, 0.95), (0.5, 0.999), (0.9, 0.9)]:
        model, data = tabular()
        assert not found(audit(model, torch.optim.AdamW(model.parameters(), lr=1e-3, betas=betas), data, nn.MSELoss()))


def test_a_learning_rate_that_overwrites_the_weights_in_one_step_is_a_warning():
    model = cnn()
    issue = found(audit(model, torch.optim.Adam(model.parameters(), lr=1.0), images()))["UPDATE_TOO_LARGE"]
    assert "at lr=1:" in issue.message and "lr_finder" in issue.fix
    # A new head initialised at zero in a group of its own has no size to compare with.
    model = cnn()
    nn.init.zeros_(model[5].weight)
    nn.init.zeros_(model[5].bias)
    groups = [{"params": [p for n, p in model.named_parameters() if not n.startswith("5.")], "lr": 1e-4},
              {"params": model[5].parameters(), "lr": 1e-2}]
    assert not found(audit(model, torch.optim.AdamW(groups), images()))


class TinyTransformer(nn.Module):
    """A transformer initialised as BERT/GPT-2 are (N(0, 0.02) matrices, LayerNorm weights of 1,
    zero biases): the LayerNorms carry the group's rms, the matrices its median."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.TransformerEncoderLayer(48, 4, 96, dropout=0.0, batch_first=True)
        self.head = nn.Linear(48, 4)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, x):
        return self.head(self.layer(x).mean(1))


def sequences() -> DataLoader:
    x = torch.randn(128, 6, 48, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x[:, 0, :4].argmax(1)), batch_size=32, shuffle=True)


class SpectralLayer(nn.Module):
    """An FNO block: complex spectral weights initialised at 1 / (in * out), as the FNO papers do,
    beside a 1x1 convolution at torch's default init."""

    def __init__(self, channels: int = 16, modes: int = 12):
        super().__init__()
        torch.manual_seed(0)
        self.lift = nn.Conv1d(1, channels, 1)
        self.weight = nn.Parameter(torch.randn(channels, channels, modes, dtype=torch.cfloat) / channels ** 2)
        self.local = nn.Conv1d(channels, channels, 1)
        self.head = nn.Conv1d(channels, 1, 1)
        self.modes = modes

    def forward(self, a):
        h = self.lift(a[:, None])
        spectrum = torch.fft.rfft(h, dim=-1)
        mixed = torch.zeros_like(spectrum)
        mixed[..., :self.modes] = torch.einsum("bim,iom->bom", spectrum[..., :self.modes], self.weight)
        return self.head(torch.relu(torch.fft.irfft(mixed, n=a.shape[-1]) + self.local(h)))[:, 0]


@pytest.mark.parametrize("lr, fires", [(3e-3, False), (1.0, True)])
def test_weights_initialised_small_on_purpose_are_judged_by_the_other_weights(lr, fires):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(128, 64, generator=g)
    loader = DataLoader(TensorDataset(a, torch.roll(a, 3, dims=1)), batch_size=32, shuffle=True)
    model = SpectralLayer()
    issues = found(audit(model, torch.optim.Adam(model.parameters(), lr=lr), loader, nn.MSELoss()))
    assert ("UPDATE_TOO_LARGE" in issues) == fires, issues


@pytest.mark.parametrize("lr, fires", [(0.05, True), (3e-4, False)])
def test_an_adam_lr_above_a_transformers_typical_weight_is_a_warning(lr, fires):
    model = TinyTransformer()
    issues = found(audit(model, torch.optim.AdamW(model.parameters(), lr=lr), sequences()))
    assert ("UPDATE_TOO_LARGE" in issues) == fires
    if fires:
        assert "median |update|" in issues["UPDATE_TOO_LARGE"].message


@pytest.mark.parametrize("max_lr, fires", [(1.0, True), (3e-3, False)])
def test_a_schedule_that_rises_to_an_sgd_learning_rate_under_adam_is_a_warning(max_lr, fires):
    model = cnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=max_lr, total_steps=200)
    issues = found(audit(model, optimizer, images(), scheduler=scheduler, max_steps=200))
    assert ("UPDATE_TOO_LARGE" in issues) == fires
    if fires:
        assert "rises to lr=1" in issues["UPDATE_TOO_LARGE"].message
        assert "OneCycleLR(max_lr=3e-3)" in issues["UPDATE_TOO_LARGE"].fix


# ---------------------------------------------------------------- an update undone after the step
def test_an_ema_written_into_the_live_weights_undoes_the_step():
    model = cnn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    frozen = {name: p.detach().clone() for name, p in model.named_parameters()}

    def ema_into_live_weights(optimizer, args, kwargs):  # meant for the EMA copy
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(0.999 * frozen[name] + 0.001 * p)

    optimizer.register_step_post_hook(ema_into_live_weights)
    issue = found(audit(model, optimizer, images()))["UPDATE_UNDONE"]
    assert "AveragedModel" in issue.fix and "0.10%" in issue.message


@pytest.mark.parametrize("build", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
    lambda p: torch.optim.SGD(p, lr=0.1),
    lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=1e-2, amsgrad=True),
    lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
])
def test_the_first_update_rule_matches_torchs_step(build):
    from optimus_preflight.preflight.analyses.update_audit import UpdateRecorder, expected_first_update

    model = cnn()
    optimizer = build(model.parameters())
    x, y = next(iter(images()))
    F.cross_entropy(model(x), y).backward()
    recorder = UpdateRecorder(optimizer, {p: n for n, p in model.named_parameters()})
    recorder.before_step()
    optimizer.step()
    recorder.after_step()
    for group in recorder.groups:
        assert torch.allclose(group.delta, expected_first_update(group), rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("lr, fires", [(2e-4, True), (4e-4, True), (1e-2, False)])
def test_bfloat16_weights_whose_updates_round_away(lr, fires):
    # at 4e-4 about a third of the weights (those above ~0.1) sit where bf16's spacing is wider
    # than twice Adam's largest step: they never move
    model = cnn().to(torch.bfloat16)
    loader = DataLoader(TensorDataset(torch.randn(64, 3, 8, 8).to(torch.bfloat16), torch.randint(0, 4, (64,))),
                        batch_size=16)
    issues = found(audit(model, torch.optim.AdamW(model.parameters(), lr=lr), loader))
    assert ("UPDATE_ROUNDED" in issues) == fires
    if fires:
        assert "bfloat16" in issues["UPDATE_ROUNDED"].message and "autocast" in issues["UPDATE_ROUNDED"].fix


def test_bfloat16_weights_whose_first_step_rounds_up_but_later_steps_round_away():
    # Linear(64, 64) weights lie within +-0.125: Adam's first step of 3e-4 rounds *up* to one
    # spacing (4.9e-4) above 0.0625 and nearly every weight moves; a later step half as large
    # rounds away for half of them
    from optimus_preflight.preflight.analyses.update_audit import half_spacing

    assert float(half_spacing(torch.tensor([0.1]), torch.finfo(torch.bfloat16).eps)) == 2.0 ** -4 * 2.0 ** -7 / 2
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)).to(
        torch.bfloat16)
    x = torch.randn(128, 64)
    loader = DataLoader(TensorDataset(x.to(torch.bfloat16), x[:, :1].to(torch.bfloat16)), batch_size=32)
    rounded = found(audit(model, torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0), loader,
                          loss_fn=nn.MSELoss()))["UPDATE_ROUNDED"]
    assert "an update half that size" in rounded.message and "no float32 master copy" in rounded.message


@pytest.mark.parametrize("noise, fires", [(1.0, True), (0.0, False)], ids=["noise_drowns_gradient", "no_noise"])
def test_noise_added_inside_step_that_drowns_the_gradient(noise, fires):
    model = cnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def add_noise(opt, args, kwargs):
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.add_(torch.randn_like(p.grad) * noise)

    optimizer.register_step_pre_hook(add_noise)
    assert ("UPDATE_NOT_GRADIENT" in found(audit(model, optimizer, images(), clip_grad_norm=1.0))) == fires


@pytest.mark.parametrize("factor", ["without_lr", "with_lr"])
def test_a_decay_hook_without_the_lr_factor_shrinks_every_step(factor):
    model, loader = tabular()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    weight_decay = 0.05

    def decay(optimizer, args, kwargs):
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.mul_(1 - (weight_decay if factor == "without_lr" else group["lr"] * weight_decay))

    optimizer.register_step_pre_hook(decay)
    issues = found(audit(model, optimizer, loader, loss_fn=nn.MSELoss()))
    if factor == "without_lr":
        issue = issues["UPDATE_WEIGHT_DECAY"]
        assert "weight_decay is 0" in issue.message and "group['lr'] * weight_decay" in issue.fix
    else:
        assert "UPDATE_WEIGHT_DECAY" not in issues


def adaptive_clipping(params, clip: float = 0.01, eps: float = 1e-3):
    """NFNet's AGC as an optimizer step pre-hook: each unit's gradient clipped to clip * its weight norm."""
    params = list(params)

    def unitwise(t: torch.Tensor) -> torch.Tensor:
        return t.abs() if t.ndim <= 1 else t.pow(2).sum(dim=tuple(range(1, t.ndim)), keepdim=True).sqrt()

    def hook(optimizer, args, kwargs):
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    limit, norm = clip * unitwise(p).clamp(min=eps), unitwise(p.grad).clamp(min=1e-6)
                    p.grad.mul_(torch.where(norm > limit, limit / norm, torch.ones_like(norm)))
    return hook


@pytest.mark.parametrize("head_clipped", [True, False], ids=["every_parameter", "head_left_out"])
def test_adaptive_clipping_of_a_zero_initialised_head_is_named(head_clipped):
    model = cnn()
    head = model[-1]
    nn.init.zeros_(head.weight), nn.init.zeros_(head.bias)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    body = [p for module in list(model)[:-1] for p in module.parameters()]
    optimizer.register_step_pre_hook(adaptive_clipping(model.parameters() if head_clipped else body))
    issues = found(audit(model, optimizer, images()))
    assert ("GRAD_CUT_IN_STEP_HOOK" in issues) == head_clipped
    assert "UPDATE_UNDONE" not in issues
    if head_clipped:
        issue = issues["GRAD_CUT_IN_STEP_HOOK"]
        assert "5.weight" in issue.message and "AGC" in issue.message and "zero-initialised" in issue.fix


@pytest.mark.parametrize("clip, fires", [(0.0, True), (1.0, False), (None, False)], ids=["zero_meant_as_off", "one", "off"])
def test_a_clip_of_zero_stops_every_update(clip, fires):
    model, loader = tabular()
    issues = found(audit(model, torch.optim.Adam(model.parameters(), lr=1e-3), loader, loss_fn=nn.MSELoss(),
                         clip_grad_norm=clip))
    assert ("UPDATE_CLIPPED" in issues) == fires
    if fires:
        assert issues["UPDATE_CLIPPED"].severity == Severity.ERROR and "clip_grad_norm=None" in issues["UPDATE_CLIPPED"].fix


@pytest.mark.parametrize("optimizer, clip, fires", [
    (lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), 0.1, True),
    (lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), None, False),
    (lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), 50.0, False),
    (lambda p: torch.optim.AdamW(p, lr=1e-3), 0.1, False),  # Adam divides the clipped gradient by its own scale
], ids=["sgd_detr_clip", "sgd_no_clip", "sgd_clip_above_the_gradients", "adamw_detr_clip"])
def test_a_clip_far_below_the_gradients_sets_sgds_step(optimizer, clip, fires):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 10, generator=g)
    y = (x @ torch.randn(10, 1, generator=g)) * 4 + 10  # targets around 10: gradients in the tens at first
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    issues = found(audit(model, optimizer(model.parameters()), DataLoader(TensorDataset(x, y), batch_size=64),
                         loss_fn=nn.MSELoss(), clip_grad_norm=clip))
    assert ("UPDATE_CLIPPED" in issues) == fires
    if fires:
        assert "SGD's step is the learning rate times the clipped gradient" in issues["UPDATE_CLIPPED"].message
