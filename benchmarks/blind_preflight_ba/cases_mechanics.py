"""Mechanics: the update, the gradient path or the training-time behaviour is wired wrongly."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ba.registry import (
    Q_ACTIONS,
    Q_DIM,
    Q_GAMMA,
    TinyClip,
    case,
    clip_loss,
    clip_val_loader,
    gen,
    loader,
    mlp,
    pairs,
    q_transitions,
    q_val_loader,
    seed,
)


def soft_update(target, source, tau):
    for t, s in zip(target.parameters(), source.parameters()):
        t.data.mul_(1 - tau).add_(tau * s.data)


@case("fqe_soft_update_arguments_swapped", "mechanics",
      "soft_update(target, source, tau) is called as soft_update(qnet, target_net, tau): the Polyak average drags the "
      "online Q-network toward the random target network every step and the target network is never updated",
      r"polyak|soft.?update|tau|swap|argument order|(target|online) (network )?(never|not) (updated|synced|synchroni)|"
      r"wrong direction|revers")
def fqe_soft_update_arguments_swapped(fixed: bool = False):
    seed(0)
    x, a, r, x2, term, _ = q_transitions(3000)
    qnet = mlp(Q_DIM, Q_ACTIONS)
    target_net = copy.deepcopy(qnet).requires_grad_(False)
    with torch.no_grad():  # a freshly initialised target, as in the user's agent class
        for p in target_net.parameters():
            p.normal_(0, 0.3)

    def td_loss(model, batch):
        s, act, rew, s2, done = batch
        if fixed:
            soft_update(target_net, model, 0.05)
        else:
            soft_update(model, target_net, 0.05)
        q = model(s).gather(1, act[:, None]).squeeze(1)
        with torch.no_grad():
            y = rew + Q_GAMMA * (1 - done) * target_net(s2).max(1).values
        return nn.functional.mse_loss(q, y)

    return dict(model=qnet, optimizer=torch.optim.Adam(qnet.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, a, r, x2, term), batch_size=64), loss_fn=td_loss,
                val_loader=q_val_loader(), max_steps=300)


@case("clip_warmup_longer_than_run", "mechanics",
      "the linear warm-up is 10000 steps (copied from a pretraining recipe) in a 300-step fine-tune, so the learning "
      "rate never leaves ~3% of its peak and the contrastive model barely moves",
      r"warm.?up.{0,60}(longer|10.?000|10k|exceed|more steps|never (ends|finish|complet|reach)|whole run|ent"
      r"ire run)|(longer|more steps) than the (run|training)|max_steps|never reach\w* (its|the) (peak|target"
      r"|base)|LambdaLR|\d+ ?% of (its|the) (peak|base)")
def clip_warmup_longer_than_run(fixed: bool = False):
    seed(0)
    img, cap, cls = pairs(2000)
    model = TinyClip()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    warmup = 30 if fixed else 10_000
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warmup))
    return dict(model=model, optimizer=opt, scheduler=sched,
                train_loader=loader(TensorDataset(img, cap, cls), batch_size=64, drop_last=True), loss_fn=clip_loss,
                val_loader=clip_val_loader(), max_steps=300)


@case("fqe_detach_on_wrong_side", "mechanics",
      "the prediction Q(s, a) is detached and the bootstrapped target r + gamma * max Q(s') is not, so the gradient "
      "only moves the next-state values toward the frozen predictions and Q(s, a) is never regressed onto its target",
      r"detach|no_grad|stop.?grad|gradient (flows|goes) (through|into) the (target|bootstrap)|"
      r"(target|bootstrap).*(not|isn.t) detached|prediction.*detached|semi.?gradient|wrong side")
def fqe_detach_on_wrong_side(fixed: bool = False):
    seed(0)
    x, a, r, x2, term, _ = q_transitions(3000)
    qnet = mlp(Q_DIM, Q_ACTIONS)

    def td_loss(model, batch):
        s, act, rew, s2, done = batch
        q = model(s).gather(1, act[:, None]).squeeze(1)
        nxt = model(s2).max(1).values
        if fixed:
            return nn.functional.mse_loss(q, (rew + Q_GAMMA * (1 - done) * nxt).detach())
        return nn.functional.mse_loss(q.detach(), rew + Q_GAMMA * (1 - done) * nxt)

    return dict(model=qnet, optimizer=torch.optim.Adam(qnet.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, a, r, x2, term), batch_size=64), loss_fn=td_loss,
                val_loader=q_val_loader(), max_steps=300)


def scans_and_labs(n, s):
    """An image feature vector and a lab-panel row; each modality alone is ambiguous, together they decide."""
    g = gen(1000 + s)
    y = torch.randint(0, 4, (n,), generator=g)
    img_protos = torch.randn(2, 20, generator=gen(71))
    lab_protos = torch.randn(2, 8, generator=gen(72))
    img = img_protos[y // 2] + 0.6 * torch.randn(n, 20, generator=g)
    lab = lab_protos[y % 2] + 0.6 * torch.randn(n, 8, generator=g)
    return img, lab, y


class ScanLabNet(nn.Module):
    def __init__(self, fixed, p_drop=0.5):
        super().__init__()
        self.fixed, self.p_drop = fixed, p_drop
        self.img = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
        self.lab = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, batch):
        img, lab = batch
        hi, hl = self.img(img), self.lab(lab)
        if (self.training or not self.fixed) and torch.rand((), device=hi.device) < self.p_drop:  # modality dropout
            keep = (torch.rand(hi.shape[0], 1, device=hi.device) < 0.5).to(hi.dtype)
            hi, hl = hi * keep, hl * (1 - keep)
        return self.head(torch.cat([hi, hl], 1))


@case("modality_dropout_active_at_eval", "mechanics",
      "modality dropout zeroes a whole modality on half the batches without checking self.training, so it is also "
      "applied in eval mode and at inference half the predictions see only the image or only the lab panel",
      r"self\.training|modality.?dropout|(applied|active|on|enabled) (also )?(in|at|during) (eval|inference|"
      r"test|validation)|at (test|inference) time|not gated")
def modality_dropout_active_at_eval(fixed: bool = False):
    seed(0)
    img, lab, y = scans_and_labs(2000, 0)
    iv, lv, yv = scans_and_labs(600, 99)
    model = ScanLabNet(fixed)

    def loss_fn(m, batch):
        return nn.functional.cross_entropy(m(batch[:2]), batch[2])

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(img, lab, y), batch_size=64), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(iv, lv, yv), batch_size=200, shuffle=False), max_steps=300)


@case("clip_accumulation_shrinks_negatives", "mechanics",
      "gradient accumulation splits the contrastive batch into micro-batches of 4 pairs, and the InfoNCE loss of each "
      "micro-batch only sees 3 negatives: accumulation is not equivalent to a large batch for a contrastive loss",
      r"micro.?batch.{0,80}(negative|contrastive|InfoNCE)|negatives|contrastive.{0,60}(batch|accumul)|accumu"
      r"lat\w*.{0,80}(contrastive|negative|InfoNCE|not equivalent)|gradient cach")
def clip_accumulation_shrinks_negatives(fixed: bool = False):
    seed(0)
    img, cap, cls = pairs(2000)
    model = TinyClip()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(img, cap, cls), batch_size=64 if fixed else 4, drop_last=True),
                loss_fn=clip_loss, accumulation_steps=1 if fixed else 16, val_loader=clip_val_loader(),
                max_steps=300)
