"""Healthy cases: five corrected twins of broken cases, and five unusual but correct setups of the domain."""

import copy

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_bg.cases_data import clip_pairs_misaligned
from benchmarks.blind_preflight_bg.cases_mechanics import CLIP, clip_kwargs, moco_momentum_update_reversed
from benchmarks.blind_preflight_bg.cases_targets import (MaskedRecon, ctc_labels_collide_with_blank, mae_kwargs,
                                                         random_mask, simclr_positive_is_self)
from benchmarks.blind_preflight_bg.cases_trained import simsiam_no_stop_gradient
from benchmarks.blind_preflight_bg.registry import (CTCNet, SSLNet, ctc_kwargs, ctc_sequences, healthy,
                                                    latent_signal, seed, ssl_kwargs, twin)

for _name, _builder in [("ctc_labels_collide_with_blank", ctc_labels_collide_with_blank),
                        ("simclr_positive_is_self", simclr_positive_is_self),
                        ("simsiam_no_stop_gradient", simsiam_no_stop_gradient),
                        ("moco_momentum_update_reversed", moco_momentum_update_reversed),
                        ("clip_pairs_misaligned", clip_pairs_misaligned)]:
    healthy(f"{_name}_fixed", f"The corrected twin of {_name}.")(twin(_builder))


@healthy("ctc_concatenated_targets_blank_last",
         "CTC with the blank at the last index (blank=C-1), labels 0..5, and the targets given as one concatenated "
         "1-D tensor of the batch's unpadded label sequences with their target lengths.")
def ctc_concatenated_targets_blank_last():
    seed(0)
    x, xl, y, yl = ctc_sequences(1024, 0, zero_based=True)

    def loss_fn(m, batch):
        x, xl, y, yl = batch
        flat = torch.cat([y[i, :yl[i]] for i in range(len(y))])
        return F.ctc_loss(m(x).transpose(0, 1), flat, xl, yl, blank=6)
    return ctc_kwargs(CTCNet(), loss_fn, (x, xl, y, yl))


@healthy("simclr_learnable_temperature",
         "NT-Xent whose temperature is a learnable log-parameter, exponentiated and clamped to [0.05, 1].")
def simclr_learnable_temperature():
    seed(0)

    class Net(SSLNet):
        def __init__(self):
            super().__init__()
            self.log_t = nn.Parameter(torch.tensor(-1.6))

    def loss_fn(m, batch):
        z1, z2 = m.project(batch[0]), m.project(batch[1])
        b = z1.size(0)
        z = F.normalize(torch.cat([z1, z2]), dim=1)
        t = m.log_t.exp().clamp(0.05, 1.0)
        sim = (z @ z.T / t).masked_fill(torch.eye(2 * b, dtype=torch.bool), float("-inf"))
        return F.cross_entropy(sim, (torch.arange(2 * b) + b) % (2 * b))
    return ssl_kwargs(Net(), loss_fn, latent_signal(1024, 0)[0])


@healthy("byol_momentum_target",
         "BYOL: online encoder + projector + predictor regress the EMA target network's projection of the other view "
         "(target under no_grad, updated by momentum 0.99 in the loss function, not in the optimizer).")
def byol_momentum_target():
    seed(0)

    class BYOL(nn.Module):
        def __init__(self):
            super().__init__()
            self.online = SSLNet(predictor=True)
            self.target = copy.deepcopy(self.online)
            self.target.requires_grad_(False)

        def forward(self, x):
            return self.online(x)

    def loss_fn(m, batch):
        if m.training:
            with torch.no_grad():
                for o, t in zip(m.online.parameters(), m.target.parameters()):
                    t.mul_(0.99).add_(o, alpha=0.01)
        p1 = m.online.predictor(m.online.project(batch[0]))
        p2 = m.online.predictor(m.online.project(batch[1]))
        with torch.no_grad():
            t1, t2 = m.target.project(batch[0]), m.target.project(batch[1])
        return 2 - F.cosine_similarity(p1, t2).mean() - F.cosine_similarity(p2, t1).mean()
    model = BYOL()
    return ssl_kwargs(model, loss_fn, latent_signal(1024, 0)[0],
                      params=[p for p in model.parameters() if p.requires_grad], lr=1e-3)


@healthy("mae_mask_in_collate_high_ratio",
         "Masked feature modelling with a 75% mask drawn in the collate_fn (the batch carries the mask), the loss "
         "averaged over the masked patches only.")
def mae_mask_in_collate_high_ratio():
    seed(0)

    def collate(items):
        x = torch.stack([it[0] for it in items])
        return x, random_mask(len(x), ratio=0.75)

    def loss_fn(m, batch):
        x, mask = batch
        err = (m(x, mask) - x).pow(2).mean(-1)
        return (err * mask).sum() / mask.sum()
    return mae_kwargs(MaskedRecon(), loss_fn, collate_fn=collate)


@healthy("clip_asymmetric_towers_fixed_temperature",
         "CLIP-style matching with towers of different depth and a fixed temperature 0.07, symmetric cross-entropy "
         "over the (B, B) logits.")
def clip_asymmetric_towers_fixed_temperature():
    seed(0)

    class Net(CLIP):
        def __init__(self):
            super().__init__()
            self.txt = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 24))
            del self.logit_scale

    def loss_fn(m, batch):
        a, b = m.encode(*batch)
        logits = a @ b.T / 0.07
        y = torch.arange(len(a))
        return 0.5 * (F.cross_entropy(logits, y) + F.cross_entropy(logits.T, y))
    return clip_kwargs(Net(), loss_fn)
