"""Healthy: five corrected twins of broken cases (the one-line fix applied) and five unusual but correct setups
(an offline PPO-style clipped objective, a hard-constrained Poisson PINN under a cosine schedule, a tiny BERT
multi-label tagger from a config, a bf16 distillation with log-space targets, a CORAL ordinal model with gradient
accumulation and clipping). None should raise a warning or an error."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_y.cases_data import y_blade_triplet_batches_without_positives
from benchmarks.blind_preflight_y.cases_mechanics import y_release_pinn_grad_without_create_graph
from benchmarks.blind_preflight_y.cases_shapes import y_battery_gaussian_nll_target_vector
from benchmarks.blind_preflight_y.cases_targets import Coral, _severity_data, y_lander_dqn_no_done_mask
from benchmarks.blind_preflight_y.cases_trained import y_birdcall_arcface_centres_not_optimized
from benchmarks.blind_preflight_y.registry import bandit, gen, healthy, loader, seed, twin

healthy("y_ok_battery_gaussian_nll_unsqueezed_target",
        "GaussianNLLLoss with the (N,) target unsqueezed to the (N, 1) shape of the mean and variance")(
    twin(y_battery_gaussian_nll_target_vector))
healthy("y_ok_lander_dqn_with_done_mask",
        "DQN whose TD target multiplies the bootstrap term by (1 - done)")(twin(y_lander_dqn_no_done_mask))
healthy("y_ok_birdcall_arcface_head_in_optimizer",
        "ArcFace head's class centres given to the optimizer next to the embedding network")(
    twin(y_birdcall_arcface_centres_not_optimized))
healthy("y_ok_release_pinn_create_graph",
        "PINN whose du/dt comes from autograd.grad(..., create_graph=True)")(
    twin(y_release_pinn_grad_without_create_graph))
healthy("y_ok_blade_triplet_pk_batches",
        "batch-hard triplet loss on P x K batches (8 identities x 4 samples) from a custom batch_sampler")(
    twin(y_blade_triplet_batches_without_positives))


# ---------------------------------------------------------------------------------------------------------------
class PolicyValue(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 64), nn.Tanh())
        self.pi = nn.Linear(64, 5)
        self.v = nn.Linear(64, 1)

    def forward(self, x):
        h = self.body(x)
        return self.pi(h), self.v(h).squeeze(-1)


@healthy("y_ok_offline_ppo_clipped_surrogate",
         "PPO-style clipped surrogate on logged bandit data with stored behaviour log-probs, per-batch advantage "
         "normalisation, a clipped value loss and an entropy bonus subtracted from the loss")
def y_ok_offline_ppo_clipped_surrogate():
    seed(301)
    x, arms = bandit(2400, 12, 5, s=301)
    g = gen(302)
    a = torch.randint(0, 5, (2400,), generator=g)
    r = (x @ arms).gather(1, a[:, None]).squeeze(1) * 0.5 + 0.1 * torch.randn(2400, generator=g)
    old_logp = torch.full((2400,), -math.log(5.0))
    old_v = torch.zeros(2400)
    model = PolicyValue()

    def loss_fn(model, batch):
        xb, ab, rb, old_lp, old_vb = batch
        logits, v = model(xb)
        dist = torch.distributions.Categorical(logits=logits)
        adv = rb - old_vb
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        ratio = torch.exp(dist.log_prob(ab) - old_lp)
        surrogate = torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        v_clipped = old_vb + (v - old_vb).clamp(-0.5, 0.5)
        v_loss = torch.max((v - rb) ** 2, (v_clipped - rb) ** 2).mean()
        return -surrogate + 0.5 * v_loss - 0.01 * dist.entropy().mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, a, r, old_logp, old_v), batch_size=128),
                loss_fn=loss_fn, max_steps=1000, clip_grad_norm=0.5)


# ---------------------------------------------------------------------------------------------------------------
class HardBCPoisson(nn.Module):
    """u(x) = x (1 - x) N(x): the Dirichlet conditions u(0) = u(1) = 0 hold by construction."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x):
        return x * (1 - x) * self.net(x)


@healthy("y_ok_poisson_pinn_hard_constraint_cosine",
         "hard-constrained PINN for -u'' = pi^2 sin(pi x) with second derivatives through create_graph, "
         "collocation points from the loader and a per-step cosine schedule")
def y_ok_poisson_pinn_hard_constraint_cosine():
    seed(311)
    x = torch.rand(2048, 1, generator=gen(311))
    model = HardBCPoisson()

    def loss_fn(model, batch):
        xc = batch[0].clone().requires_grad_(True)
        u = model(xc)
        du = torch.autograd.grad(u, xc, torch.ones_like(u), create_graph=True)[0]
        d2u = torch.autograd.grad(du, xc, torch.ones_like(du), create_graph=True)[0]
        return ((-d2u - math.pi ** 2 * torch.sin(math.pi * xc)) ** 2).mean()

    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x), batch_size=128),
                loss_fn=loss_fn, max_steps=1000,
                scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000))


# ---------------------------------------------------------------------------------------------------------------
class TaggedNotes(Dataset):
    """Token sequences whose 6 tags are the presence of 6 trigger tokens (multi-label)."""

    def __init__(self, n, s):
        g = gen(s)
        self.ids = torch.randint(10, 120, (n, 24), generator=g)
        for tag in range(6):
            has = torch.rand(n, generator=g) < 0.3
            pos = torch.randint(1, 24, (n,), generator=g)
            self.ids[has, pos[has]] = 2 + tag
        self.ids[:, 0] = 1  # [CLS]
        self.labels = torch.stack([(self.ids == 2 + t).any(1) for t in range(6)], 1).float()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(24, dtype=torch.long),
                "labels": self.labels[i]}


@healthy("y_ok_tiny_bert_multilabel_from_config",
         "tiny BertForSequenceClassification from a config with problem_type='multi_label_classification' "
         "(float multi-hot labels, BCE inside the model), dict batches, loss from model(**batch).loss, warm-up")
def y_ok_tiny_bert_multilabel_from_config():
    from transformers import BertConfig, BertForSequenceClassification

    seed(321)
    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=6,
                        problem_type="multi_label_classification", pad_token_id=0)
    model = BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    return dict(model=model, optimizer=optimizer, train_loader=loader(TaggedNotes(1024, 321), batch_size=32),
                val_loader=loader(TaggedNotes(256, 322), batch_size=64, shuffle=False), scheduler=warmup,
                max_steps=600)


# ---------------------------------------------------------------------------------------------------------------
@healthy("y_ok_bf16_distillation_log_target",
         "distillation under bf16 with a frozen teacher in eval mode, KLDivLoss(reduction='batchmean', "
         "log_target=True) scaled by T**2 plus hard-label cross-entropy")
def y_ok_bf16_distillation_log_target():
    seed(331)
    g = gen(331)
    x = torch.randn(2400, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    y = (x @ w).argmax(1)
    teacher = nn.Sequential(nn.Linear(16, 4))
    with torch.no_grad():
        teacher[0].weight.copy_(2.0 * w.T)
        teacher[0].bias.zero_()
    teacher.eval().requires_grad_(False)
    student = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 4))
    kl = nn.KLDivLoss(reduction="batchmean", log_target=True)
    T = 3.0

    def loss_fn(model, batch):
        xb, yb = batch
        teacher.to(xb.device)
        s_logits = model(xb)
        with torch.no_grad():
            t_logp = F.log_softmax(teacher(xb).float() / T, dim=1)
        soft = kl(F.log_softmax(s_logits.float() / T, dim=1), t_logp) * T ** 2
        return 0.7 * soft + 0.3 * F.cross_entropy(s_logits.float(), yb)

    return dict(model=student, optimizer=torch.optim.AdamW(student.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), batch_size=64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), batch_size=200, shuffle=False),
                loss_fn=loss_fn, precision="bf16", max_steps=1500)


# ---------------------------------------------------------------------------------------------------------------
@healthy("y_ok_coral_ordinal_explicit_order_accumulation",
         "CORAL ordinal model with an explicit mild < moderate < severe < critical mapping, 2-step gradient "
         "accumulation, clip_grad_norm 1.0 and a StepLR counted in optimizer steps")
def y_ok_coral_ordinal_explicit_order_accumulation():
    seed(341)
    x, labels = _severity_data(s=341)
    order = {"mild": 0, "moderate": 1, "severe": 2, "critical": 3}
    y = torch.tensor([order[v] for v in labels])
    model = Coral(12, 4)

    def loss_fn(model, batch):
        xb, yb = batch
        levels = (yb[:, None] > torch.arange(3, device=yb.device)[None, :]).float()
        return F.binary_cross_entropy_with_logits(model(xb), levels)

    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), batch_size=32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), batch_size=200, shuffle=False),
                loss_fn=loss_fn, accumulation_steps=2, clip_grad_norm=1.0, max_steps=1000,
                scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=400, gamma=0.5))
