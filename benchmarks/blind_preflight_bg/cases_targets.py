"""Family targets: which index / position / label the domain's loss is told is right."""

import copy

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_bg.registry import (CTCNet, SSLNet, case, ctc_exact_match, ctc_kwargs, ctc_sequences,
                                                    ctc_step, fix, fixed_of, latent_signal, loader, retrieval_top1,
                                                    seed, ssl_kwargs, gen)
from torch.utils.data import TensorDataset


@case("ctc_labels_collide_with_blank", "targets",
      "The label ids are encoded from 0 (labels 0..5) while ctc_loss uses blank=0, so the first real label is the "
      "blank and can never be emitted; the encoding should start at 1.",
      r"blank.{0,120}(0|zero|collid|same (id|index)|reserved|real (label|class|character))|"
      r"(label|class|character|target)s?.{0,60}(start|begin|encod\w*|shift\w*).{0,40}(from |at |by )?(0|1|one)|"
      r"(\+ ?1|shift).{0,40}(label|target)s?")
def ctc_labels_collide_with_blank(fixed=False):
    seed(0)
    data = ctc_sequences(1024, 0, zero_based=not fixed)
    return ctc_kwargs(CTCNet(), ctc_step, data)


fix("ctc_labels_collide_with_blank", fixed_of(ctc_labels_collide_with_blank), ctc_exact_match(), "val exact match")


@case("ctc_target_lengths_include_padding", "targets",
      "target_lengths is the padded width of the (N, S) target tensor for every sample instead of each sequence's "
      "true length, so CTC is trained to emit the padding id (0, the blank) as extra labels.",
      r"target_lengths?.{0,120}(pad|max|full|width|true length|actual)|"
      r"(pad\w*|fill\w*) (id|value|token|zeros?).{0,80}(target|label)s?.{0,40}(count|includ|as (a )?label)|"
      r"true (target |label )?lengths?")
def ctc_target_lengths_include_padding(fixed=False):
    seed(0)

    def loss_fn(m, batch):
        x, xl, y, yl = batch
        tl = yl if fixed else torch.full_like(yl, y.size(1))
        return F.ctc_loss(m(x).transpose(0, 1), y, xl, tl, blank=0, zero_infinity=True)
    return ctc_kwargs(CTCNet(), loss_fn, ctc_sequences(1024, 0))


fix("ctc_target_lengths_include_padding", fixed_of(ctc_target_lengths_include_padding), ctc_exact_match(),
    "val exact match")


@case("simclr_positive_is_self", "targets",
      "The NT-Xent labels are torch.arange(2N) on a similarity matrix whose diagonal is not masked, so each view's "
      "target is its own self-similarity instead of its augmented partner (i + N) mod 2N.",
      r"(diagonal|self.?similarit|itself|own (view|embedding|row)).{0,120}(target|label|positive|mask)|"
      r"(target|label|positive)s?.{0,80}(diagonal|self.?similarit|itself|partner|other view|\+ ?N|i ?\+ ?b)|"
      r"arange\(2 ?\* ?\w+\).{0,60}(label|target)")
def simclr_positive_is_self(fixed=False):
    seed(0)

    def loss_fn(m, batch):
        z1, z2 = m.project(batch[0]), m.project(batch[1])
        b = z1.size(0)
        z = F.normalize(torch.cat([z1, z2]), dim=1)
        sim = z @ z.T / 0.2
        labels = (torch.arange(2 * b) + b) % (2 * b) if fixed else torch.arange(2 * b)
        return F.cross_entropy(sim, labels)
    return ssl_kwargs(SSLNet(), loss_fn, latent_signal(1024, 0)[0])


fix("simclr_positive_is_self", fixed_of(simclr_positive_is_self), retrieval_top1, "val retrieval top-1")


class MoCo(nn.Module):
    """Query encoder + momentum key encoder + a queue of past keys (a buffer)."""

    def __init__(self, k: int = 512, m: float = 0.99, t: float = 0.2):
        super().__init__()
        self.net = SSLNet()
        self.key = copy.deepcopy(self.net)
        for p in self.key.parameters():
            p.requires_grad_(False)
        self.m, self.t = m, t
        self.register_buffer("queue", F.normalize(torch.randn(k, 16, generator=gen(7)), dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        return self.net(x)

    @torch.no_grad()
    def momentum_update(self):
        for q, k in zip(self.net.parameters(), self.key.parameters()):
            k.mul_(self.m).add_(q.detach(), alpha=1 - self.m)

    @torch.no_grad()
    def enqueue(self, keys):
        n, p = keys.size(0), int(self.ptr)
        self.queue[p:p + n] = keys
        self.ptr.fill_((p + n) % self.queue.size(0))


def moco_loss(fixed_labels=True, enqueue_first=False, reversed_momentum=False):
    def loss_fn(m, batch):
        if m.training:
            if reversed_momentum:
                with torch.no_grad():
                    for qp, kp in zip(m.net.parameters(), m.key.parameters()):
                        qp.mul_(m.m).add_(kp.detach(), alpha=1 - m.m)
            else:
                m.momentum_update()
        q = F.normalize(m.net.project(batch[0]), dim=1)
        with torch.no_grad():
            k = F.normalize(m.key.project(batch[1]), dim=1)
        if enqueue_first and m.training:
            m.enqueue(k)
        l_pos = (q * k).sum(1, keepdim=True)
        l_neg = q @ m.queue.clone().T
        logits = torch.cat([l_pos, l_neg], 1) / m.t
        labels = torch.zeros(len(q), dtype=torch.long) if fixed_labels else torch.arange(len(q))
        loss = F.cross_entropy(logits, labels)
        if m.training and not enqueue_first:
            m.enqueue(k)
        return loss
    return loss_fn


def moco_kwargs(model, loss_fn, params=None):
    params = [p for p in model.parameters() if p.requires_grad] if params is None else params
    return ssl_kwargs(model, loss_fn, latent_signal(1024, 0)[0], params=params)


@case("moco_labels_arange", "targets",
      "The MoCo logits put the positive key in column 0 (cat([l_pos, l_neg])), but the cross-entropy labels are "
      "torch.arange(N) copied from an in-batch loss, so each query is pushed toward a queue entry instead of its key.",
      r"(label|target)s?.{0,100}(zeros?|column 0|index 0|first column|positive (key|logit|column))|"
      r"arange.{0,80}(label|target|queue|column)|positive.{0,60}(column|index|position) 0")
def moco_labels_arange(fixed=False):
    seed(0)
    model = MoCo()
    return moco_kwargs(model, moco_loss(fixed_labels=fixed))


fix("moco_labels_arange", fixed_of(moco_labels_arange), retrieval_top1, "val retrieval top-1")


class MaskedRecon(nn.Module):
    """Masked feature modelling: P patches of D features, masked patches replaced by a learned token, an MLP
    reconstructs every patch from the rest."""

    def __init__(self, p=8, d=6, h=128):
        super().__init__()
        self.p, self.d = p, d
        self.token = nn.Parameter(torch.zeros(d))
        self.net = nn.Sequential(nn.Linear(p * (d + 1), h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, p * d))

    def forward(self, x, mask=None):
        if mask is None:
            mask = torch.zeros(x.shape[:2], dtype=torch.bool)
        inp = torch.where(mask[..., None], self.token.expand_as(x), x)
        inp = torch.cat([inp, mask[..., None].float()], -1).flatten(1)
        return self.net(inp).view_as(x)


def patch_data(n, s):
    g = gen(s)
    z = torch.randn(n, 4, generator=g)
    w = torch.randn(8, 4, 6, generator=gen(95))
    return torch.tanh(torch.einsum("nk,pkd->npd", z, w)) + 0.05 * torch.randn(n, 8, 6, generator=g)


def random_mask(n, p=8, ratio=0.5, g=None):
    return torch.rand(n, p, generator=g).argsort(1) < int(p * ratio)


def masked_mse(model, kw):
    """Validation MSE on the masked patches (fixed masks), lower is better."""
    x = kw["val_patches"]
    mask = random_mask(len(x), g=gen(21))
    was = model.training
    model.eval()
    with torch.no_grad():
        err = (model(x, mask) - x).pow(2).mean(-1)
    model.train(was)
    return err[mask].mean().item()


def mae_kwargs(model, loss_fn, collate_fn=None):
    x = patch_data(1024, 0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x), 64, drop_last=True, collate_fn=collate_fn), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(patch_data(256, 5)), 64, shuffle=False),
                val_patches=patch_data(256, 5))


@case("mae_loss_on_visible_patches", "targets",
      "The masked-reconstruction loss is averaged over the visible patches (mask == 0) instead of the masked ones, "
      "so the model learns to copy its input and never learns to predict hidden patches.",
      r"(loss|error|mse).{0,100}(visible|unmasked|mask ?== ?0|~ ?mask|inverted mask|not masked)|"
      r"(visible|unmasked|mask ?== ?0|~ ?mask).{0,100}(loss|error|reconstruct)|"
      r"(copy|identity).{0,60}(input|visible)|masked (patch|position|token)s? (only|instead)")
def mae_loss_on_visible_patches(fixed=False):
    seed(0)

    def loss_fn(m, batch):
        x = batch[0]
        mask = random_mask(len(x))
        err = (m(x, mask) - x).pow(2).mean(-1)
        return err[mask].mean() if fixed else err[~mask].mean()
    return mae_kwargs(MaskedRecon(), loss_fn)


fix("mae_loss_on_visible_patches", fixed_of(mae_loss_on_visible_patches), masked_mse, "val masked MSE",
    higher=False)
