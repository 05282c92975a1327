"""What is trained: five setups where the weights that should learn are not the ones the step updates."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset
from transformers import BertConfig, BertForSequenceClassification, ViTConfig, ViTForImageClassification

from benchmarks.blind_preflight_v.registry import acc_of, case, fix, fixed_of, gen, loader, mean_of, seed


# --------------------------------------------------------------------------- W1: ViT re-headed after the optimizer
def _spectro_patches(n, g, n_classes=5):
    """16x16 log-mel crops: the class is the band a tone sits in, at a random time and loudness."""
    y = torch.randint(0, n_classes, (n,), generator=g)
    mel = torch.arange(16, dtype=torch.float32)
    profile = torch.exp(-0.5 * ((mel[None] - (1.5 + 3 * y[:, None].float())) / 1.0) ** 2)
    start = torch.randint(0, 8, (n, 1), generator=g)
    on = ((torch.arange(16)[None] >= start) & (torch.arange(16)[None] < start + 8)).float()
    loud = 0.7 + 0.6 * torch.rand(n, 1, 1, generator=g)
    x = loud * profile[:, :, None] * on[:, None, :] + 0.15 * torch.randn(n, 16, 16, generator=g)
    return x[:, None], y


def _vit_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(pixel_values=x).logits, y)


@case("vit_head_swapped_after_optimizer", "what_is_trained",
      bug="The backbone is frozen and the optimizer is built over the parameters that still require grad, and only "
          "then model.classifier is replaced by a new nn.Linear for the 5 new classes, so the new head's weights are "
          "not in the optimizer and nothing that runs in the forward is ever updated.",
      cause_pattern=r"(classifier|head|new (layer|linear|module)|score)\w*.{0,80}(not in|missing from|absent from|"
                    r"outside|not (held|registered) (by|in)) (the |any )?optimi[sz]er|(not in|missing from|absent from) "
                    r"(the )?optimi[sz]er.{0,80}(classifier|head|new (layer|linear|module))|(built|created|constructed) "
                    r"(the optimi[sz]er )?before.{0,60}(replac|swap|head|classifier)|(replac|swap|re-?assign)\w* .{0,60}"
                    r"after .{0,30}optimi[sz]er|optimi[sz]er.{0,60}(stale|old|previous|replaced) (head|classifier|"
                    r"parameters|module)|rebuild the optimi[sz]er")
def vit_reheaded(fixed: bool = False):
    seed(0)
    x, y = _spectro_patches(1500, gen(21))
    model = ViTForImageClassification(ViTConfig(image_size=16, patch_size=4, num_channels=1, hidden_size=32,
                                                num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                                num_labels=3))
    for p in model.vit.parameters():
        p.requires_grad = False
    if fixed:
        model.classifier = nn.Linear(32, 5)
        model.num_labels = model.config.num_labels = 5
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    if not fixed:
        model.classifier = nn.Linear(32, 5)          # the new task has 5 classes, not the 3 of the checkpoint
        model.num_labels = model.config.num_labels = 5
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=_vit_loss, max_steps=200)


fix("vit_head_swapped_after_optimizer", fixed_of(vit_reheaded),
    acc_of(lambda m, b: (m(pixel_values=b[0]).logits.argmax(-1), b[1])), "val accuracy", steps=200)


# --------------------------------------------------------------------------- W2: MAPE in numpy, re-wrapped as a leaf
class DemandMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(14, 64), nn.ReLU(), nn.Linear(64, 1))
        self.register_buffer("level", torch.tensor(100.0))
        self.register_buffer("scale", torch.tensor(30.0))

    def forward(self, x):
        return self.net(x).squeeze(-1) * self.scale + self.level


def _demand(n, g):
    dow = torch.randint(0, 7, (n,), generator=g)
    weekly = torch.tensor([0.8, 0.9, 1.0, 1.0, 1.1, 1.4, 1.3])
    base = 60 + 80 * torch.rand(n, 1, generator=g)
    lags = base * weekly[(dow[:, None] - torch.arange(7, 0, -1)) % 7] * (1 + 0.03 * torch.randn(n, 7, generator=g))
    y = base.squeeze(1) * weekly[dow] * (1 + 0.03 * torch.randn(n, generator=g))
    x = torch.cat([lags / 100.0, F.one_hot(dow, 7).float()], 1)
    return x, y


def _mape_loss(fixed):
    def loss_fn(model, batch):
        x, y = batch
        pred = model(x)
        if fixed:
            return ((pred - y).abs() / y.abs()).mean()
        y_np, p_np = y.cpu().numpy(), pred.detach().cpu().numpy()     # sklearn-style metric as the loss
        mape = np.mean(np.abs((y_np - p_np) / y_np))
        return torch.tensor(mape, requires_grad=True, device=y.device)  # "element 0 ... does not require grad"
    return loss_fn


def _mape_sum(m, b):
    x, y = b
    return ((m(x) - y).abs() / y.abs()).sum().item(), len(y)


@case("mape_loss_rewrapped_as_new_tensor", "what_is_trained",
      bug="The MAPE loss is computed in numpy on pred.detach() and returned as torch.tensor(mape, requires_grad=True) "
          "to silence 'element 0 of tensors does not require grad', so the loss is a new leaf cut from the graph: "
          "backward reaches no model parameter and the optimizer never moves the weights.",
      cause_pattern=r"torch\.tensor\(.{0,40}requires_grad|requires_grad ?= ?True|new (leaf|tensor)|(leaf|tensor) .{0,40}"
                    r"(cut|detached|disconnected) from the (autograd )?graph|(detach\w*|numpy|\.item\(\)).{0,80}"
                    r"(graph|grad_fn|gradient)|no grad_fn|(grad(ient)?s? (are|is) )?(none|zero) for (all|every) "
                    r"(model )?param|(backward|gradients?) (never )?reach\w* no|does not require grad")
def mape_rewrapped(fixed: bool = False):
    seed(0)
    x, y = _demand(1700, gen(22))
    model = DemandMLP()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1400], y[:1400]), 32),
                val_loader=loader(TensorDataset(x[1400:], y[1400:]), 100, shuffle=False),
                loss_fn=_mape_loss(fixed), max_steps=300)


fix("mape_loss_rewrapped_as_new_tensor", fixed_of(mape_rewrapped), mean_of(_mape_sum), "val MAPE", higher=False)


# --------------------------------------------------------------------------- W3: item table from_pretrained (frozen)
class MatrixFactorization(nn.Module):
    def __init__(self, item_init, n_users, fixed):
        super().__init__()
        self.user = nn.Embedding(n_users, item_init.size(1))
        self.item = nn.Embedding.from_pretrained(item_init, freeze=False) if fixed else \
            nn.Embedding.from_pretrained(item_init)                    # "start the items from our own init"
        self.item_bias = nn.Embedding(item_init.size(0), 1)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.zeros_(self.item_bias.weight)

    def forward(self, users, items):
        return (self.user(users) * self.item(items)).sum(-1) + self.item_bias(items).squeeze(-1)


def _implicit(g, n_users=300, n_items=150, n_groups=5):
    ug = torch.randint(0, n_groups, (n_users,), generator=g)
    ig = torch.arange(n_items) % n_groups
    p = torch.where(ug[:, None] == ig[None], 0.5, 0.02)
    likes = torch.rand(n_users, n_items, generator=g) < p
    rows, vals, val_rows = [], [], []
    for u in range(n_users):
        pos = likes[u].nonzero().squeeze(1)
        pos = pos[torch.randperm(len(pos), generator=g)]
        held, seen = pos[:2], pos[2:]
        negs_pool = (~likes[u]).nonzero().squeeze(1)
        negs = negs_pool[torch.randint(0, len(negs_pool), (len(seen),), generator=g)]
        rows += [(u, int(i)) for i in seen] + [(u, int(i)) for i in negs]
        vals += [1.0] * len(seen) + [0.0] * len(negs)
        for i in held:
            val_rows.append((u, int(i), int(negs_pool[int(torch.randint(0, len(negs_pool), (1,), generator=g))])))
    rows, val_rows = torch.tensor(rows), torch.tensor(val_rows)
    return (rows[:, 0], rows[:, 1], torch.tensor(vals)), (val_rows[:, 0], val_rows[:, 1], val_rows[:, 2])


def _bce(model, batch):
    u, i, label = batch
    return F.binary_cross_entropy_with_logits(model(u, i), label)


def _pair_auc(m, b):
    u, pos, neg = b
    return (m(u, pos) > m(u, neg)).long(), torch.ones_like(u)


@case("item_table_from_pretrained_frozen", "what_is_trained",
      bug="The item embedding table is created with nn.Embedding.from_pretrained(init) to use a custom "
          "initialisation, and from_pretrained freezes the weights by default (freeze=True), so the item vectors stay "
          "random and never learn which items go together.",
      cause_pattern=r"from_pretrained|freeze ?= ?(True|False)|(embedding|item)\w*.{0,60}(frozen|requires_grad ?= ?False|"
                    r"not (trainable|trained|updated))|(frozen|requires_grad=False).{0,60}(embedding|item)")
def item_frozen(fixed: bool = False):
    seed(0)
    g = gen(23)
    (u, i, lab), (vu, vp, vn) = _implicit(g)
    init = torch.randn(150, 16, generator=g) * 0.1
    model = MatrixFactorization(init, 300, fixed)
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2),
                train_loader=loader(TensorDataset(u, i, lab), 128),
                val_loader=loader(TensorDataset(vu, vp, vn), 200, shuffle=False),
                loss_fn=_bce, max_steps=300)


fix("item_table_from_pretrained_frozen", fixed_of(item_frozen), acc_of(_pair_auc), "val AUC (held-out like vs random)")


# --------------------------------------------------------------------------- W4: VQ bottleneck without straight-through
class KeywordVQ(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.enc = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 8))
        self.codebook = nn.Embedding(16, 8)
        self.cls = nn.Linear(8, 8)

    def forward(self, x):
        z_e = self.enc(x)
        codes = torch.cdist(z_e, self.codebook.weight).argmin(-1)
        z_q = self.codebook(codes)
        z = z_e + (z_q - z_e).detach() if self.fixed else z_q
        return self.cls(z), z_e, z_q


def _vq_loss(model, batch):
    x, y = batch
    logits, z_e, z_q = model(x)
    return F.cross_entropy(logits, y) + F.mse_loss(z_q, z_e.detach()) + 0.25 * F.mse_loss(z_e, z_q.detach())


def _keywords(n, g, protos, speakers):
    y = torch.randint(0, 8, (n,), generator=g)
    spk = speakers[torch.randint(0, len(speakers), (n,), generator=g)]
    x = torch.cat([protos[y], spk], 1) + 0.3 * torch.randn(n, 24, generator=g)
    return x, y


@case("vq_codes_without_straight_through", "what_is_trained",
      bug="The quantiser picks codes with argmin and feeds codebook(codes) to the classifier without the "
          "straight-through estimator (z_e + (z_q - z_e).detach()), so the classification loss never reaches the "
          "encoder: it only gets the commitment term and keeps encoding the speaker instead of the keyword.",
      cause_pattern=r"straight[- ]through|z_e \+ \(z_q ?- ?z_e\)\.detach|arg(min|max).{0,80}(gradient|differentiab|"
                    r"no grad)|(non-?differentiab|not differentiab).{0,80}(argmin|argmax|quanti[sz]|codebook|index)"
                    r"|(encoder|upstream|earlier layers?).{0,60}(no|zero|never gets?|receives? no) (gradient|grad)\w*"
                    r"|(no|zero) (gradient|grad)s? (reach|flow)\w* (to|into|through) the encoder")
def vq_no_ste(fixed: bool = False):
    seed(0)
    g = gen(24)
    protos = torch.randn(8, 4, generator=g)
    speakers = 2.0 * torch.randn(30, 20, generator=g)
    x, y = _keywords(1600, g, protos, speakers)
    model = KeywordVQ(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1300], y[:1300]), 32),
                val_loader=loader(TensorDataset(x[1300:], y[1300:]), 100, shuffle=False),
                loss_fn=_vq_loss, max_steps=300)


fix("vq_codes_without_straight_through", fixed_of(vq_no_ste), acc_of(lambda m, b: (m(b[0])[0].argmax(-1), b[1])),
    "val accuracy")


# --------------------------------------------------------------------------- W5: LoRA with both factors zero
class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, r: int = 4, alpha: float = 8.0, fixed: bool = False):
        super().__init__()
        self.base = base
        self.lora_A = nn.Parameter(torch.zeros(r, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))
        if fixed:
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        # else: "zero init so that step 0 is exactly the pretrained model" -- applied to A as well as B
        self.scaling = alpha / r

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.T @ self.lora_B.T) * self.scaling


def _add_lora(model, fixed):
    targets = ("query", "value", "dense", "classifier")
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and child_name in targets:
                setattr(module, child_name, LoRALinear(child, fixed=fixed))
    for name, p in model.named_parameters():
        p.requires_grad = "lora_" in name
    return model


def _sentiment_tokens(n, g, length=16):
    ids = torch.randint(3, 60, (n, length), generator=g)
    ids[:, 0] = 1                                            # [CLS]
    pos = ((ids >= 10) & (ids < 30)).sum(1)
    neg = (ids >= 40).sum(1)
    keep = pos != neg
    return ids[keep], (pos > neg).long()[keep]


class Tickets(Dataset):
    def __init__(self, ids, y):
        self.ids, self.y = ids, y

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.y[i]}


@case("lora_factors_both_zero_init", "what_is_trained",
      bug="The hand-written LoRA adapters initialise both lora_A and lora_B to zeros, so the update B @ A and both "
          "factors' gradients (dA = B^T g, dB = g A^T) are zero forever; with the base model frozen nothing trains. "
          "Only B should start at zero, A needs a random (Kaiming) init.",
      cause_pattern=r"lora_?[AB]|both (factors?|matrices|adapters?).{0,40}zero|(A|B) (and|&) (A|B) .{0,30}zero"
                    r"|zero[- ]init\w*.{0,80}(both|A and B|symmetr)|kaiming|(gradients?|grads?) .{0,40}(stay|remain|"
                    r"are|is) (exactly |identically )?zero|no (parameter|weight) .{0,30}(ever )?(moves|changes|updates)")
def lora_zero(fixed: bool = False):
    seed(0)
    ids, y = _sentiment_tokens(1700, gen(25))
    model = BertForSequenceClassification(BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=64,
                                                     max_position_embeddings=32, num_labels=2))
    _add_lora(model, fixed)
    return dict(model=model, optimizer=torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2),
                train_loader=loader(Tickets(ids[:1300], y[:1300]), 32),
                val_loader=loader(Tickets(ids[1300:], y[1300:]), 100, shuffle=False),
                loss_fn=None, max_steps=200)


fix("lora_factors_both_zero_init", fixed_of(lora_zero),
    acc_of(lambda m, b: (m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1),
                         b["labels"])), "val accuracy", steps=200)
