"""Set t, family what_is_trained: part of the model the user means to train never changes (left out of the
optimizer's groups, stored as a buffer, under no_grad, frozen by a default, or started where no gradient reaches)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset
from transformers import ViTConfig, ViTModel

from benchmarks.blind_preflight_t.registry import (
    acc_on,
    blobs,
    case,
    dev,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_on,
    seed,
    val_batches,
)

# --------------------------------------------------------------------------------------------------------------------
# Multi-task classifier + denoising decoder: the decoder's parameter group is built but never appended.


def glyphs(n: int, g: torch.Generator, n_classes: int = 6):
    templates = (torch.rand(n_classes, 12, 12, generator=g) > 0.55).float()
    y = torch.randint(0, n_classes, (n,), generator=g)
    clean = templates[y]
    shifts = torch.randint(-1, 2, (n, 2), generator=g)
    clean = torch.stack([torch.roll(c, (int(s[0]), int(s[1])), dims=(0, 1)) for c, s in zip(clean, shifts)])
    noisy = clean + 0.4 * torch.randn(clean.shape, generator=g)
    return noisy.reshape(n, 144), clean.reshape(n, 144), y


class ClassifyAndDenoise(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(144, 64), nn.ReLU(), nn.Linear(64, 16))
        self.classifier = nn.Linear(16, 6)
        self.decoder = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 144))

    def forward(self, x):
        z = self.encoder(x)
        return self.classifier(z), self.decoder(z)


@case("multitask_decoder_group_never_appended", "what_is_trained",
      bug="The optimizer is built from per-module parameter groups with their own learning rates; the denoising "
          "decoder's group dict is created but never appended to the list, so the decoder keeps its random "
          "weights while its reconstruction loss is still minimised (only through the encoder).",
      cause_pattern=r"decoder|param_groups?|parameter groups?|(group|dict)\w* .{0,40}(never )?append\w*")
def multitask_decoder_group_never_appended(fixed: bool = False) -> dict:
    seed(0)
    noisy, clean, y = glyphs(1500, gen(21))
    model = ClassifyAndDenoise()
    groups = []
    for module, lr in ((model.encoder, 1e-3), (model.classifier, 3e-3)):
        groups.append({"params": list(module.parameters()), "lr": lr})
    decoder_group = {"params": list(model.decoder.parameters()), "lr": 1e-3}
    if fixed:
        groups.append(decoder_group)

    def multitask_loss(model, batch):
        x, target, label = batch
        logits, recon = model(x)
        return F.cross_entropy(logits, label) + F.mse_loss(recon, target)

    return dict(model=model, optimizer=torch.optim.Adam(groups),
                train_loader=loader(TensorDataset(noisy[:1200], clean[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(noisy[1200:], clean[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=multitask_loss, max_steps=300)


def recon_fwd(m, b):
    d = dev(m)
    return m(b[0].to(d))[1], b[1].to(d)


fix("multitask_decoder_group_never_appended", fixed_of(multitask_decoder_group_never_appended),
    rmse_on(val_batches, recon_fwd), "val reconstruction RMSE", steps=300, higher=False)

# --------------------------------------------------------------------------------------------------------------------
# Hand-written point-set layers whose weight is a registered buffer (so .to(device) moves it), not a Parameter.


class PointLinear(nn.Module):
    """A per-point linear layer written by hand; weight registered as a buffer so model.to(device) moves it."""

    def __init__(self, d_in: int, d_out: int, fixed: bool):
        super().__init__()
        w = torch.randn(d_in, d_out) / math.sqrt(d_in)
        if fixed:
            self.weight = nn.Parameter(w)
        else:
            self.register_buffer("weight", w)
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class PointSetNet(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.mlp1, self.mlp2 = PointLinear(2, 32, fixed), PointLinear(32, 64, fixed)
        self.head = PointLinear(64, 3, fixed)

    def forward(self, pts):  # (B, P, 2)
        h = torch.relu(self.mlp2(torch.relu(self.mlp1(pts))))
        return self.head(h.max(dim=1).values)


def outlines(n: int, g: torch.Generator, p: int = 32):
    """2-D point sets on a circle, square or triangle outline, rotated and scaled at random, plus jitter."""
    y = torch.randint(0, 3, (n,), generator=g)
    s = torch.rand(n, p, generator=g)
    pts = torch.zeros(n, p, 2)
    for shape, corners in ((1, 4), (2, 3)):
        ang = torch.arange(corners + 1).float() * 2 * math.pi / corners
        verts = torch.stack([ang.cos(), ang.sin()], -1)
        seg = (s * corners).long().clamp(max=corners - 1)
        frac = (s * corners - seg)[..., None]
        poly = verts[seg] * (1 - frac) + verts[seg + 1] * frac
        pts = torch.where((y == shape)[:, None, None], poly, pts)
    circle = torch.stack([(2 * math.pi * s).cos(), (2 * math.pi * s).sin()], -1)
    pts = torch.where((y == 0)[:, None, None], circle, pts)
    theta = torch.rand(n, generator=g) * 2 * math.pi
    rot = torch.stack([torch.stack([theta.cos(), -theta.sin()], -1), torch.stack([theta.sin(), theta.cos()], -1)], -2)
    scale = 0.8 + 0.4 * torch.rand(n, 1, 1, generator=g)
    return scale * pts @ rot + 0.03 * torch.randn(n, p, 2, generator=g), y


@case("point_layers_weights_registered_as_buffers", "what_is_trained",
      bug="The hand-written point-set layers store their weight with register_buffer (to make model.to(device) move "
          "it) instead of as an nn.Parameter, so model.parameters() and the optimizer only hold the biases and the "
          "weights keep their random initial values.",
      cause_pattern=r"register_buffer|buffers?\b|nn\.Parameter|not (an? )?(nn\.)?parameters?|"
                    r"(weight|tensor)s? .*(not|never) (in|among|part of|returned by) (model\.)?parameters\(\)|"
                    r"only (the )?bias(es)? (are|is|get|will be) (trained|updated|optimi[sz]ed)")
def point_layers_weights_registered_as_buffers(fixed: bool = False) -> dict:
    seed(0)
    pts, y = outlines(1500, gen(22))
    model = PointSetNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(pts[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(pts[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=250)


def cls_fwd(m, b):
    return m(b[0].to(dev(m))).argmax(-1), b[-1].to(dev(m))


fix("point_layers_weights_registered_as_buffers", fixed_of(point_layers_weights_registered_as_buffers),
    acc_on(val_batches, cls_fwd), "val accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# A tiny ViT (built from a config) whose forward runs the backbone under torch.no_grad() (feature-extraction code).


def bar_tiles(n: int, g: torch.Generator):
    """16x16 tiles holding a short bar in one of 4 orientations (the class), at a random place, with noise."""
    y = torch.randint(0, 4, (n,), generator=g)
    img = torch.zeros(n, 1, 16, 16)
    steps = torch.tensor([[0, 1], [1, 0], [1, 1], [1, -1]])
    start = torch.randint(4, 12, (n, 2), generator=g)
    for i in range(n):
        for k in range(-3, 4):
            r, c = start[i] + k * steps[y[i]]
            img[i, 0, int(r), int(c)] = 1.0
    return img + 0.3 * torch.randn(img.shape, generator=g), y


def tiny_vit_config() -> ViTConfig:
    return ViTConfig(image_size=16, patch_size=4, num_channels=1, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)


class ViTClassifier(nn.Module):
    def __init__(self, fixed: bool, n_classes: int = 4):
        super().__init__()
        self.fixed = fixed
        self.vit = ViTModel(tiny_vit_config(), add_pooling_layer=False)
        self.head = nn.Linear(32, n_classes)

    def forward(self, pixel_values):
        if self.fixed:
            cls = self.vit(pixel_values=pixel_values).last_hidden_state[:, 0]
        else:
            with torch.no_grad():  # from the feature-extraction notebook
                cls = self.vit(pixel_values=pixel_values).last_hidden_state[:, 0]
        return self.head(cls)


@case("vit_backbone_forward_under_no_grad", "what_is_trained",
      bug="The classifier's forward runs the ViT backbone inside torch.no_grad() (left over from a feature-extraction "
          "notebook) although the whole model is passed to the optimizer for fine-tuning, so no gradient reaches the "
          "backbone and only the linear head is trained on the randomly initialised ViT's features.",
      cause_pattern=r"no_grad|inference_mode|(backbone|vit|encoder)\w* .*(no|zero|none|never (get|receive)s?) "
                    r"grad|(no|zero) grad\w* .*(backbone|vit|encoder)|grad(ient)?s? (are|is) (none|zero|missing) "
                    r"for .*(vit|backbone|encoder)|only the (linear )?head (is|gets|receives)|"
                    r"detach\w* .*(graph|backbone)|outside (the )?(autograd )?graph")
def vit_backbone_forward_under_no_grad(fixed: bool = False) -> dict:
    seed(0)
    x, y = bar_tiles(1500, gen(23))
    model = ViTClassifier(fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("vit_backbone_forward_under_no_grad", fixed_of(vit_backbone_forward_under_no_grad), acc_on(val_batches, cls_fwd),
    "val accuracy", steps=300)

# --------------------------------------------------------------------------------------------------------------------
# Link prediction with node embeddings warm-started by nn.Embedding.from_pretrained (freeze=True by default).


def community_edges(n: int, k: int, g: torch.Generator, p_in: float = 0.12, p_out: float = 0.004):
    comm = torch.arange(n) % k
    same = comm[:, None] == comm[None, :]
    a = torch.triu((torch.rand(n, n, generator=g) < torch.where(same, p_in, p_out)), 1)
    pos = a.nonzero()
    pos = pos[torch.randperm(len(pos), generator=g)]
    neg = torch.randint(0, n, (len(pos), 2), generator=g)
    pairs = torch.cat([pos, neg])
    label = torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))])
    order = torch.randperm(len(pairs), generator=g)
    return pairs[order], label[order]


class LinkScorer(nn.Module):
    def __init__(self, init: torch.Tensor, fixed: bool):
        super().__init__()
        self.nodes = nn.Embedding.from_pretrained(init, freeze=False) if fixed else nn.Embedding.from_pretrained(init)
        self.relation = nn.Parameter(torch.ones(init.shape[1]))  # DistMult diagonal relation
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, pairs):  # (B, 2) node ids
        e = self.nodes(pairs)
        return (e[:, 0] * self.relation * e[:, 1]).sum(-1) + self.bias


@case("link_embeddings_from_pretrained_frozen", "what_is_trained",
      bug="The node embeddings are warm-started with nn.Embedding.from_pretrained(init), whose freeze argument "
          "defaults to True, so the embedding table (the part link prediction must learn) gets requires_grad=False "
          "and only the DistMult relation vector and bias on top are trained.",
      cause_pattern=r"from_pretrained|freeze ?= ?(True|False)|freeze (argument|default)|nodes\.weight|"
                    r"embedding\w* .{0,60}(frozen|requires_grad|not (trained|updated)|never (trained|updated))|"
                    r"(frozen|requires_grad ?= ?False).{0,60}embedding")
def link_embeddings_from_pretrained_frozen(fixed: bool = False) -> dict:
    seed(0)
    g = gen(24)
    pairs, label = community_edges(400, 8, g, p_in=0.5)
    n_val = len(pairs) // 5
    init = 0.5 * torch.randn(400, 8, generator=g)  # the embeddings saved by the previous run's setup
    model = LinkScorer(init, fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-2),
                train_loader=loader(TensorDataset(pairs[n_val:], label[n_val:]), 128),
                val_loader=loader(TensorDataset(pairs[:n_val], label[:n_val]), 256, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=250)


def link_fwd(m, b):
    d = dev(m)
    return (m(b[0].to(d)) > 0).long(), b[1].to(d).long()


fix("link_embeddings_from_pretrained_frozen", fixed_of(link_embeddings_from_pretrained_frozen),
    acc_on(val_batches, link_fwd), "val link accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# Every conv / linear weight zero-initialised by an init function (DiT-style zero init applied to all layers).


def spot_tiles(n: int, g: torch.Generator):
    c, img = blobs(n, 16, g)
    return img[:, None] + 0.2 * torch.randn(n, 1, 16, 16, generator=g), c / 16


class SpotLocator(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                                 nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 2))
        if not fixed:
            self.apply(self.init_weights)

    @staticmethod
    def init_weights(m):
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.zeros_(m.weight)  # "start from the identity / zero output", as the final layers of DiT
            nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.net(x)


@case("spot_locator_all_weights_zero_init", "what_is_trained",
      bug="An init function applied with model.apply zero-initialises every Conv2d and Linear weight (the DiT "
          "final-layer trick applied to all layers), so all hidden activations are 0, every weight gradient is 0 "
          "and only the last bias ever moves: the network predicts the mean location.",
      cause_pattern=r"zero[s_-]? ?init\w*|init\w* .*(to )?zeros?|zeros_|all[- ]zero weights|"
                    r"weights? (are|is|were) (all )?(zero|0)|symmetr\w*|(zero|no) gradients? (for|to|reach)\w* "
                    r"(the )?(weights|hidden|layers)|dead (network|layers|units)|constant (output|prediction)")
def spot_locator_all_weights_zero_init(fixed: bool = False) -> dict:
    seed(0)
    x, y = spot_tiles(1500, gen(25))
    model = SpotLocator(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=250)


def reg_fwd(m, b):
    d = dev(m)
    return m(b[0].to(d)), b[1].to(d)


fix("spot_locator_all_weights_zero_init", fixed_of(spot_locator_all_weights_zero_init), rmse_on(val_batches, reg_fwd),
    "val location RMSE", steps=250, higher=False)
