"""Healthy cases: five corrected twins of broken cases and five unusual but correct setups."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ba.cases_data import bc_obs_action_off_by_one
from benchmarks.blind_preflight_ba.cases_mechanics import ScanLabNet, scans_and_labs
from benchmarks.blind_preflight_ba.cases_shapes import bc_steering_mse_broadcast
from benchmarks.blind_preflight_ba.cases_targets import (
    ActorCritic,
    clip_targets_are_class_ids,
    fqe_bootstraps_through_terminals,
)
from benchmarks.blind_preflight_ba.cases_trained import bc_log_std_not_a_parameter
from benchmarks.blind_preflight_ba.registry import (
    Q_ACTIONS,
    Q_DIM,
    Q_GAMMA,
    TinyClip,
    clip_loss,
    clip_val_loader,
    decisions_val_loader,
    gen,
    healthy,
    loader,
    logged_decisions,
    pairs,
    q_transitions,
    q_val_loader,
    seed,
    twin,
)

healthy("bc_steering_mse_broadcast_fixed", "twin: steering targets unsqueezed to (B, 1) like the policy output")(
    twin(bc_steering_mse_broadcast))
healthy("fqe_bootstraps_through_terminals_fixed", "twin: TD target masked with (1 - done)")(
    twin(fqe_bootstraps_through_terminals))
healthy("clip_targets_are_class_ids_fixed", "twin: contrastive targets torch.arange(B) on the logits' device")(
    twin(clip_targets_are_class_ids))
healthy("bc_obs_action_off_by_one_fixed", "twin: observation and action of the same time step")(
    twin(bc_obs_action_off_by_one))
healthy("bc_log_std_not_a_parameter_fixed", "twin: log_std is an nn.Parameter")(twin(bc_log_std_not_a_parameter))


class DuelingQ(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(Q_DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.value = nn.Linear(64, 1)
        self.adv = nn.Linear(64, Q_ACTIONS)

    def forward(self, s):
        h = self.trunk(s)
        a = self.adv(h)
        return self.value(h) + a - a.mean(1, keepdim=True)


@healthy("fqe_double_dqn_huber_groups_clipped",
         "dueling Q-network, double-DQN target from a hard-synced target network, Huber loss, two param groups "
         "(trunk / heads), gradient clipping at 10")
def fqe_double_dqn_huber_groups_clipped():
    seed(0)
    x, a, r, x2, term, _ = q_transitions(3000)
    qnet = DuelingQ()
    target_net = copy.deepcopy(qnet).requires_grad_(False)
    calls = [0]

    def td_loss(model, batch):
        s, act, rew, s2, done = batch
        calls[0] += 1
        if calls[0] % 25 == 0:
            target_net.load_state_dict(model.state_dict())
        q = model(s).gather(1, act[:, None]).squeeze(1)
        with torch.no_grad():
            best = model(s2).argmax(1, keepdim=True)
            y = rew + Q_GAMMA * (1 - done) * target_net(s2).gather(1, best).squeeze(1)
        return nn.functional.smooth_l1_loss(q, y)

    opt = torch.optim.Adam([{"params": qnet.trunk.parameters(), "lr": 1e-3},
                            {"params": list(qnet.value.parameters()) + list(qnet.adv.parameters()), "lr": 2e-3}])
    return dict(model=qnet, optimizer=opt, train_loader=loader(TensorDataset(x, a, r, x2, term), batch_size=64),
                loss_fn=td_loss, val_loader=q_val_loader(), max_steps=300, clip_grad_norm=10.0)


@healthy("clip_locked_image_tower_cosine",
         "LiT-style contrastive tuning: the image tower frozen on purpose (requires_grad False, left out of the "
         "optimizer), text tower and logit_scale trained, cosine schedule over max_steps")
def clip_locked_image_tower_cosine():
    seed(0)
    img, cap, cls = pairs(2000)
    model = TinyClip()
    model.image.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=300)
    return dict(model=model, optimizer=opt, scheduler=sched,
                train_loader=loader(TensorDataset(img, cap, cls), batch_size=64, drop_last=True), loss_fn=clip_loss,
                val_loader=clip_val_loader(), max_steps=300)


@healthy("awr_normalised_advantages_bf16",
         "advantage-weighted regression with a detached, batch-normalised advantage, clamped weights, a value "
         "baseline head, run in bf16")
def awr_normalised_advantages_bf16():
    seed(0)
    x, a, r, _ = logged_decisions(3000)
    model = ActorCritic()

    def awr_loss(m, batch):
        s, act, ret = batch
        v = m.value(s).float()
        adv = (ret - v).detach()
        adv = (adv - adv.mean()) / (adv.std() + 1e-6)
        w = torch.exp(adv).clamp(max=20.0)
        logp = torch.log_softmax(m(s).float(), -1).gather(1, act[:, None]).squeeze(1)
        return -(w * logp).mean() + 0.5 * nn.functional.mse_loss(v, ret)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, a, r), batch_size=64), loss_fn=awr_loss,
                val_loader=decisions_val_loader(), max_steps=300, precision="bf16")


def masked_demos(n, s):
    """Six actions, a random subset (at least two) valid in each state; the expert takes the best valid action."""
    g = gen(1300 + s)
    x = torch.randn(n, 10, generator=g)
    scores = x @ torch.randn(10, 6, generator=gen(93))
    valid = torch.rand(n, 6, generator=g) < 0.6
    valid[torch.arange(n), torch.randint(0, 6, (n,), generator=g)] = True
    valid[torch.arange(n), torch.randint(0, 6, (n,), generator=g)] = True
    expert = scores.masked_fill(~valid, float("-inf")).argmax(1)
    return torch.cat([x, valid.float()], 1), valid, expert


class MaskedPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 6))

    def forward(self, batch):
        x, valid = batch
        logits = self.net(x)
        return logits.masked_fill(~valid, torch.finfo(logits.dtype).min)


@healthy("bc_action_masking_accumulated",
         "behavioural cloning with invalid actions masked to finfo.min before cross-entropy, gradient accumulation "
         "over 4 micro-batches")
def bc_action_masking_accumulated():
    seed(0)
    x, valid, y = masked_demos(3000, 0)
    xv, vv, yv = masked_demos(600, 99)
    policy = MaskedPolicy()

    def loss_fn(m, batch):
        return nn.functional.cross_entropy(m(batch[:2]), batch[2])

    return dict(model=policy, optimizer=torch.optim.Adam(policy.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, valid, y), batch_size=16), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(xv, vv, yv), batch_size=200, shuffle=False), max_steps=300,
                accumulation_steps=4)


@healthy("fusion_modality_dropout_adamw_nodecay",
         "image + lab-panel late fusion with modality dropout gated by self.training, AdamW with no weight decay on "
         "biases, a one-cycle schedule sized to max_steps")
def fusion_modality_dropout_adamw_nodecay():
    seed(0)
    img, lab, y = scans_and_labs(2000, 0)
    iv, lv, yv = scans_and_labs(600, 99)
    model = ScanLabNet(fixed=True, p_drop=0.3)
    decay = [p for n, p in model.named_parameters() if not n.endswith("bias")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=2e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=300)

    def loss_fn(m, batch):
        return nn.functional.cross_entropy(m(batch[:2]), batch[2])

    return dict(model=model, optimizer=opt, scheduler=sched,
                train_loader=loader(TensorDataset(img, lab, y), batch_size=64), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(iv, lv, yv), batch_size=200, shuffle=False), max_steps=300)
