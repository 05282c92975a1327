"""Set j, family mechanics: optimizer, scheduler and step-loop mechanics, and the mechanics of the loss function."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_j.registry import case, fix, gen, loader, mean_over, seed


def _val_acc(model, kw):
    def fn(m, b):
        x, y = (t.to(next(m.parameters()).device) for t in b)
        return (m(x).argmax(-1) == y).sum().item(), len(y)
    return mean_over(model, kw["val_loader"], fn)


# --------------------------------------------------------------------------------------------------------------------
# 1. physics-informed net whose derivative is taken with torch.autograd.grad without create_graph=True


class PINN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)


def _ode_loss(create_graph):
    def ode_residual_loss(model, batch):
        """u'(x) = cos(2x) on [0, 3] with u(0) = 0 (solution sin(2x) / 2)."""
        x = batch[0].detach().clone().requires_grad_(True)
        u = model(x)
        du = torch.autograd.grad(u.sum(), x, create_graph=create_graph)[0]
        residual = du - torch.cos(2 * x)
        boundary = model(torch.zeros(1, 1, device=x.device))
        return residual.pow(2).mean() + boundary.pow(2).mean()
    return ode_residual_loss


def _val_solution_mae(model, kw):
    x = torch.linspace(0, 3, 200, device=next(model.parameters()).device).unsqueeze(1)
    with torch.no_grad():
        return (model(x) - torch.sin(2 * x) / 2).abs().mean().item()


@case("ode_pinn_derivative_without_create_graph", "mechanics",
      "the physics residual uses du = torch.autograd.grad(u.sum(), x)[0] without create_graph=True: the derivative is "
      "returned as a constant with no graph back to the weights, so the residual term (du - cos 2x)^2 contributes no "
      "gradient at all and only the boundary term u(0) = 0 is trained; the net never learns the solution",
      r"create_graph|autograd\.grad|higher.?order|double.?backward|(derivative|residual term)[^.]*(no graph|const"
      r"ant|detached|not differentiable|no gradient)|(no|zero) gradient[^.]*(residual|derivative|physics)")

def ode_pinn_derivative_without_create_graph(fixed: bool = False):
    seed(0)
    x = torch.rand(2048, 1, generator=gen(110)) * 3
    model = PINN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x), 128), loss_fn=_ode_loss(create_graph=fixed), max_steps=500)


def _fact_create_graph():
    w = torch.tensor(2.0, requires_grad=True)
    x = torch.tensor(1.5, requires_grad=True)
    du = torch.autograd.grad(w * x ** 2, x)[0]
    du2 = torch.autograd.grad(w * x ** 2, x, create_graph=True)[0]
    print(f"  without create_graph: du.requires_grad = {du.requires_grad}; with it: {du2.requires_grad}")


fix("ode_pinn_derivative_without_create_graph", lambda: ode_pinn_derivative_without_create_graph(fixed=True),
    _val_solution_mae, "MAE to the exact solution", _fact_create_graph, steps=500, higher=False)


# --------------------------------------------------------------------------------------------------------------------
# 2. warmup scheduler built while the optimizer still had its placeholder lr=0.0


def _warmup_cosine(total, warmup=30):
    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))
    return factor


@case("tabular_scheduler_created_before_lr_was_set", "mechanics",
      "the optimizer is created with a placeholder lr=0.0, the warmup LambdaLR is built on it, and only then is the real "
      "rate written into param_groups[...]['lr'] = 3e-3: LambdaLR captured initial_lr = 0 at construction and sets "
      "lr = 0 * factor on every scheduler step, so after the first step the learning rate is 0 for the whole run",
      r"initial_lr|base_lrs?|placeholder|(before|after) (the )?(lr|learning rate) (was|is) set|(captur|record|sav|"
      r"memori)\w*[^.]*(lr|learning.?rate)|(lr|learning.?rate)[^.]*(\b0\b|zero)[^.]*(schedul|every step|whole run)|"
      r"schedul\w*[^.]*(\b0\b|zero|construct|created)")
def tabular_scheduler_created_before_lr_was_set(fixed: bool = False):
    seed(0)
    g = gen(120)
    x = torch.randn(3000, 20, generator=g)
    y = (torch.tanh(x @ torch.randn(20, 32, generator=g) / 20 ** 0.5 * 1.5) @ torch.randn(32, 5, generator=g)).argmax(1)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)       # the real lr comes from the config below
    if fixed:
        for group in optimizer.param_groups:
            group["lr"] = 3e-3
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup_cosine(400))
    if not fixed:
        for group in optimizer.param_groups:
            group["lr"] = 3e-3
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 64),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=400)


def _fact_initial_lr():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    opt.param_groups[0]["lr"] = 3e-3
    opt.step()
    sched.step()
    print(f"  initial_lr captured {opt.param_groups[0]['initial_lr']}; lr after one scheduler step "
          f"{opt.param_groups[0]['lr']}")


fix("tabular_scheduler_created_before_lr_was_set", lambda: tabular_scheduler_created_before_lr_was_set(fixed=True),
    _val_acc, "val accuracy", _fact_initial_lr, steps=400)


# --------------------------------------------------------------------------------------------------------------------
# 3. token-mean loss whose token count is a running total that is never reset

T_TAG, V_TAG, C_TAG = 20, 30, 4


def _tagging(n=2400, s=130):
    """Token tags are a fixed function of the token id and its left neighbour; right padding with id 0 (tag -100)."""
    g = gen(s)
    tok = torch.randint(1, V_TAG, (n, T_TAG), generator=g)
    lengths = torch.randint(6, T_TAG + 1, (n,), generator=g)
    table = torch.randint(0, C_TAG, (V_TAG, V_TAG), generator=g)
    prev = torch.cat([torch.zeros(n, 1, dtype=torch.long), tok[:, :-1]], 1)
    tags = table[tok, prev]
    pad = torch.arange(T_TAG)[None, :] >= lengths[:, None]
    tok[pad], tags[pad] = 0, -100
    return tok, tags


class GRUTagger(nn.Module):
    def __init__(self, d=48):
        super().__init__()
        self.emb = nn.Embedding(V_TAG, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, C_TAG)

    def forward(self, tok):
        return self.out(self.gru(self.emb(tok))[0])


class TokenMeanLoss:
    """Summed token cross-entropy divided by the number of real (non-padding) tokens."""

    def __init__(self, running_total):
        self.running_total = running_total
        self.tokens = 0

    def __call__(self, model, batch):
        tok, tags = batch
        loss_sum = F.cross_entropy(model(tok).reshape(-1, C_TAG), tags.reshape(-1), ignore_index=-100, reduction="sum")
        if self.running_total:
            self.tokens += int((tags != -100).sum())
        else:
            self.tokens = int((tags != -100).sum())
        return loss_sum / self.tokens


def _val_tag_acc(model, kw):
    def fn(m, b):
        tok, tags = (v.to(next(m.parameters()).device) for v in b)
        keep = tags != -100
        return (m(tok).argmax(-1)[keep] == tags[keep]).sum().item(), keep.sum().item()
    return mean_over(model, kw["val_loader"], fn)


@case("tagger_token_mean_divides_by_running_token_total", "mechanics",
      "the token-mean loss divides the batch's summed cross-entropy by self.tokens, which is incremented with "
      "self.tokens += mask.sum() on every call and never reset: by step 100 the divisor is ~100 batches' worth of "
      "tokens, so the loss and its gradients shrink like 1/step and the SGD tagger stops learning after its first steps",
      r"running (total|count|sum)|never reset|not reset|\+=|cumulative|accumulat\w* (count|total|tokens)|(di"
      r"visor|denominator|normali[sz]\w*)[^.]*(grow|increas|total|every call|ever)|(shrink|decay)\w*[^.]*1\s"
      r"*/\s*(step|t\b)|stateful")

def tagger_token_mean_divides_by_running_token_total(fixed: bool = False):
    seed(0)
    tok, tags = _tagging()
    model = GRUTagger()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
                train_loader=loader(TensorDataset(tok[:2000], tags[:2000]), 32),
                val_loader=loader(TensorDataset(tok[2000:], tags[2000:]), 200, shuffle=False),
                loss_fn=TokenMeanLoss(running_total=not fixed), clip_grad_norm=1.0, max_steps=400)


def _fact_running_total():
    loss = TokenMeanLoss(running_total=True)
    torch.manual_seed(0)
    m = GRUTagger()
    tok, tags = _tagging(64)
    values = [loss(m, (tok[:32], tags[:32])).item() for _ in range(4)]
    print("  the same batch four times:", [f"{v:.3f}" for v in values], "(divisor", loss.tokens, "tokens)")


fix("tagger_token_mean_divides_by_running_token_total",
    lambda: tagger_token_mean_divides_by_running_token_total(fixed=True),
    _val_tag_acc, "val token accuracy", _fact_running_total, steps=400)


# --------------------------------------------------------------------------------------------------------------------
# 4. TD(0) value learning with the stop-gradient on the prediction instead of the bootstrap target

N_STATES, GAMMA = 30, 0.9


def _chain(s=140):
    g = gen(s)
    P = torch.rand(N_STATES, N_STATES, generator=g) ** 12
    P = P / P.sum(1, keepdim=True)
    R = torch.randn(N_STATES, generator=g) + 1.0
    V = torch.linalg.solve(torch.eye(N_STATES) - GAMMA * P, R)
    feats = torch.randn(N_STATES, 16, generator=g)
    state = torch.randint(0, N_STATES, (6000,), generator=g)
    nxt = torch.multinomial(P[state], 1, generator=g).squeeze(1)
    return feats, state, R[state] + 0.1 * torch.randn(6000, generator=g), nxt, V


class ValueNet(nn.Module):
    def __init__(self, feats):
        super().__init__()
        self.register_buffer("feats", feats)
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, state):
        return self.net(self.feats[state]).squeeze(-1)


def _td_loss(detach_target):
    def td0_loss(model, batch):
        s, r, s_next = batch
        v, v_next = model(s), model(s_next)
        if detach_target:
            return F.mse_loss(v, r + GAMMA * v_next.detach())
        return F.mse_loss(v.detach(), r + GAMMA * v_next)
    return td0_loss


def _val_value_rmse(true_v):
    def metric(model, kw):
        with torch.no_grad():
            v = model(torch.arange(N_STATES, device=next(model.parameters()).device)).cpu()
        return ((v - true_v) ** 2).mean().sqrt().item()
    return metric


@case("chain_td_value_stop_gradient_on_wrong_side", "mechanics",
      "the TD(0) loss is mse(V(s).detach(), r + gamma * V(s')): the stop-gradient sits on the prediction instead of the "
      "bootstrap target, so the gradient only flows into V(s') and pulls the NEXT state's value towards (V(s) - r) / "
      "gamma, the Bellman relation run backwards; the values drift away from the true ones",
      r"detach|stop.?grad|semi.?gradient|bootstrap|(td|bellman)[^.]*target|V\(s'\)|next.?state|wrong side")
def chain_td_value_stop_gradient_on_wrong_side(fixed: bool = False):
    seed(0)
    feats, s, r, s_next, _ = _chain()
    model = ValueNet(feats)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(s, r, s_next), 64), loss_fn=_td_loss(detach_target=fixed),
                max_steps=500)


def _fact_td():
    v, v_next = torch.tensor(1.0, requires_grad=True), torch.tensor(2.0, requires_grad=True)
    F.mse_loss(v.detach(), 0.5 + GAMMA * v_next).backward()
    print(f"  mse(V(s).detach(), r + g V(s')): grad V(s) = {v.grad}, grad V(s') = {v_next.grad.item():.2f}")


fix("chain_td_value_stop_gradient_on_wrong_side", lambda: chain_td_value_stop_gradient_on_wrong_side(fixed=True),
    _val_value_rmse(_chain()[4]), "RMSE to the true state values", _fact_td, steps=500, higher=False)


# --------------------------------------------------------------------------------------------------------------------
# 5. learned multi-task uncertainty weights with the precision's sign flipped


class TwoTaskNet(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.cls = nn.Linear(64, 3)
        self.reg = nn.Linear(64, 1)
        self.log_vars = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        h = self.trunk(x)
        return self.cls(h)


def _uncertainty_loss(sign):
    def weighted_two_task_loss(model, batch):
        x, y, t = batch
        h = model.trunk(x)
        losses = torch.stack([F.cross_entropy(model.cls(h), y), F.mse_loss(model.reg(h).squeeze(-1), t)])
        precision = torch.exp(sign * model.log_vars)
        return (precision * losses + model.log_vars).sum()
    return weighted_two_task_loss


@case("sensor_multitask_uncertainty_weights_exp_sign_flipped", "mechanics",
      "the learned task weighting (Kendall et al.) is written exp(log_var) * loss + log_var instead of "
      "exp(-log_var) * loss + log_var: its derivative in log_var is exp(log_var) * loss + 1 > 0, so SGD drives both "
      "log_vars down without bound, the task weights exp(log_var) fall to ~0 within a few dozen steps and the network "
      "stops learning while the total loss keeps falling",
      r"log_vars?\b|uncertainty|exp\(\s*-?\s*log_|task weights?|(weight|weighting)s?[^.]*(collapse|vanish|sh"
      r"rink)|kendall|homoscedastic")

def sensor_multitask_uncertainty_weights_exp_sign_flipped(fixed: bool = False):
    seed(0)
    g = gen(150)
    x = torch.randn(3000, 16, generator=g)
    w = torch.randn(16, 3, generator=g)
    y = (torch.tanh(x @ w)).argmax(1)
    t = torch.tanh(x @ torch.randn(16, generator=g) / 4) * 2
    model = TwoTaskNet()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
                train_loader=loader(TensorDataset(x[:2500], y[:2500], t[:2500]), 64),
                val_loader=loader(TensorDataset(x[2500:], y[2500:], t[2500:]), 250, shuffle=False),
                loss_fn=_uncertainty_loss(-1.0 if fixed else 1.0), max_steps=300)


def _fact_uncertainty():
    for sign in (1.0, -1.0):
        s = torch.zeros(1, requires_grad=True)
        (torch.exp(sign * s) * 0.5 + s).sum().backward()
        print(f"  exp({'+' if sign > 0 else '-'}log_var) * L + log_var at log_var=0, L=0.5: d/dlog_var = "
              f"{s.grad.item():+.2f}")


def _val_two_task_acc(model, kw):
    def fn(m, b):
        x, y, _ = (v.to(next(m.parameters()).device) for v in b)
        return (m(x).argmax(-1) == y).sum().item(), len(y)
    return mean_over(model, kw["val_loader"], fn)


fix("sensor_multitask_uncertainty_weights_exp_sign_flipped",
    lambda: sensor_multitask_uncertainty_weights_exp_sign_flipped(fixed=True),
    _val_two_task_acc, "val accuracy (classification task)", _fact_uncertainty, steps=300)
