"""Set h, family 'what_is_trained': which parameters really learn (init, freezing, registration, gradient path)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_h.registry import accuracy, case, fix, gen, loader, seed, val_acc

# --------------------------------------------------------------------------------------------------------------
# W1: nn.LeakyReLU(True) -> negative_slope=1.0, the MLP is linear


def rings(n, s):
    g = gen(s)
    x = torch.randn(n, 8, generator=g)
    r = x[:, :2].norm(dim=1)
    y = (r > 1.0).long() + (r > 1.8).long()                 # concentric bands: no linear boundary
    return x, y


def _rings(slope_bug=True):
    seed(0)
    x, y = rings(2048, 101)
    vx, vy = rings(512, 102)
    act = (lambda: nn.LeakyReLU(True)) if slope_bug else (lambda: nn.LeakyReLU(0.01, inplace=True))
    model = nn.Sequential(nn.Linear(8, 64), act(), nn.Linear(64, 64), act(), nn.Linear(64, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@case("sensor_bands_leaky_relu_true_is_slope_one", "what_is_trained",
      bug="the activations are nn.LeakyReLU(True), copied from the nn.ReLU(True) (inplace) idiom: LeakyReLU's first "
          "positional argument is negative_slope, so the slope is 1.0 and every activation is the identity: the "
          "MLP collapses to one linear map and cannot learn the ring-shaped classes",
      cause_pattern=r"leaky_?relu|negative_slope|slope (of )?1(\.0)?|identity activation|activations? (is|are) "
                    r"(the )?identity|collapses? to (a |one )?linear|(network|model|mlp) is (effectively )?linear")
def sensor_bands_leaky_relu_true_is_slope_one():
    return _rings(True)


fix("sensor_bands_leaky_relu_true_is_slope_one", lambda: _rings(False), val_acc, "val accuracy",
    fact=lambda: print("  fact: nn.LeakyReLU(True).negative_slope =", nn.LeakyReLU(True).negative_slope))

# --------------------------------------------------------------------------------------------------------------
# W2: the wrapper's __init__ re-initialises the loaded, frozen backbone


W_PRETRAINED = torch.randn(6, 32, generator=gen(111)) / 32 ** 0.5


def spectra(n, s):
    g = gen(s)
    x = torch.randn(n, 32, generator=g)
    h = torch.relu(x @ W_PRETRAINED.T * 3)
    y = (h @ torch.randn(6, 5, generator=gen(112))).argmax(1)
    return x, y


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 6, bias=False)

    def forward(self, x):
        return torch.relu(self.proj(x) * 3)


class Classifier(nn.Module):
    def __init__(self, backbone, init_everything=True):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 5))
        (self if init_everything else self.head).apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.1)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.head(self.backbone(x))


def _frozen(init_everything=True):
    seed(0)
    x, y = spectra(2048, 113)
    vx, vy = spectra(512, 114)
    backbone = Encoder()
    backbone.load_state_dict({"proj.weight": W_PRETRAINED.clone()})   # the pretrained checkpoint
    backbone.requires_grad_(False)
    model = Classifier(backbone, init_everything)
    return dict(model=model, optimizer=torch.optim.Adam(model.head.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@case("spectra_frozen_backbone_reinitialised_by_wrapper_init", "what_is_trained",
      bug="the pretrained encoder is loaded with load_state_dict and frozen, then wrapped in a Classifier whose "
          "__init__ ends with self.apply(self._init_weights): apply() recurses into the backbone and overwrites the "
          "loaded weights with a fresh normal(0, 0.1) init, so the head trains on a frozen RANDOM projection",
      cause_pattern=r"(re-?initiali[sz]\w*|overwrit\w*|reset\w*).{0,80}(load|pretrain|checkpoint|backbone|frozen)|"
                    r"(load|pretrain|checkpoint)\w*.{0,80}(overwrit|re-?init|reset|lost|discarded)|"
                    r"\.apply\(|_init_weights|frozen (and )?random|random (frozen|init\w*) (backbone|encoder)")
def spectra_frozen_backbone_reinitialised_by_wrapper_init():
    return _frozen(True)


fix("spectra_frozen_backbone_reinitialised_by_wrapper_init", lambda: _frozen(False), val_acc, "val accuracy",
    fact=lambda: print("  fact: backbone still equals the checkpoint after Classifier():",
                       torch.equal(_frozen(True)["model"].backbone.proj.weight, W_PRETRAINED)))

# --------------------------------------------------------------------------------------------------------------
# W3: item factors registered as a buffer


def ratings(n, s, n_users=100, n_items=150):
    g = gen(s)
    U = torch.randn(n_users, 4, generator=gen(121))
    V = torch.randn(n_items, 4, generator=gen(122))
    u = torch.randint(0, n_users, (n,), generator=g)
    i = torch.randint(0, n_items, (n,), generator=g)
    return u, i, (U[u] * V[i]).sum(1) + 0.3 * torch.randn(n, generator=g)


class MF(nn.Module):
    def __init__(self, buffer=True, n_users=100, n_items=150, dim=8):
        super().__init__()
        self.users = nn.Embedding(n_users, dim)
        nn.init.normal_(self.users.weight, std=0.3)
        factors = torch.randn(n_items, dim) * 0.3
        if buffer:
            self.register_buffer("item_factors", factors)     # 'so it follows .to(device) and the state_dict'
        else:
            self.item_factors = nn.Parameter(factors)

    def forward(self, u, i):
        return (self.users(u) * self.item_factors[i]).sum(1)


def mf_loss(model, batch):
    u, i, r = batch
    return F.mse_loss(model(u, i), r)


def _mf(buffer=True):
    seed(0)
    u, i, r = ratings(8000, 123)
    vu, vi, vr = ratings(2000, 124)
    model = MF(buffer)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(u, i, r), 128),
                val_loader=loader(TensorDataset(vu, vi, vr), 500, shuffle=False), loss_fn=mf_loss, max_steps=300)


@torch.no_grad()
def val_rmse(model, kw):
    u, i, r = ratings(2000, 124)
    return F.mse_loss(model(u, i), r).sqrt().item()


@case("ratings_item_factors_registered_as_buffer", "what_is_trained",
      bug="the item factor table is created with self.register_buffer('item_factors', ...) 'so it follows "
          ".to(device) and is saved', but a buffer is not a parameter: it gets no gradient and is not in "
          "model.parameters(), so the item side of the factorisation stays at its random init and only the user "
          "vectors learn",
      cause_pattern=r"register_buffer|buffer|item_factors|not (a |an )?(nn\.)?parameter\b")
def ratings_item_factors_registered_as_buffer():
    return _mf(True)


fix("ratings_item_factors_registered_as_buffer", lambda: _mf(False), val_rmse, "val RMSE", higher=False,
    fact=lambda: print("  fact: 'item_factors' in named_parameters():",
                       "item_factors" in dict(MF(True).named_parameters())))

# --------------------------------------------------------------------------------------------------------------
# W4: DANN gradient reversal in front of the label head


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -ctx.alpha * g, None


def domains(n, s):
    g = gen(s)
    d = torch.randint(0, 2, (n,), generator=g)
    x = torch.randn(n, 12, generator=g)
    y = (x[:, :6] @ torch.randn(6, 3, generator=gen(131))).argmax(1)
    x[:, 6:] += 1.5 * d[:, None].float()                 # the domain shift lives in the other features
    return x, y, d


class DANN(nn.Module):
    def __init__(self, reverse_on_label=True):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.label_head = nn.Linear(32, 3)
        self.domain_head = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 2))
        self.reverse_on_label = reverse_on_label

    def forward(self, x):
        h = self.features(x)
        if self.reverse_on_label:
            return self.label_head(GradReverse.apply(h, 1.0)), self.domain_head(h)
        return self.label_head(h), self.domain_head(GradReverse.apply(h, 1.0))


def dann_loss(model, batch):
    x, y, d = batch
    label_logits, domain_logits = model(x)
    return F.cross_entropy(label_logits, y) + F.cross_entropy(domain_logits, d)


def _dann(reverse_on_label=True):
    seed(0)
    x, y, d = domains(2048, 132)
    vx, vy, _ = domains(512, 133)
    model = DANN(reverse_on_label)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y, d), 64),
                val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False), loss_fn=dann_loss, max_steps=300)


@torch.no_grad()
def dann_acc(model, kw):
    return accuracy(model, kw["val_loader"], fwd=lambda m, b: (m(b[0])[0].argmax(-1), b[1]))


@case("defects_dann_gradient_reversal_before_label_head", "what_is_trained",
      bug="the gradient reversal layer sits in front of the LABEL classifier instead of the domain classifier: the "
          "shared feature extractor receives the negated task gradient and is trained to make the defect classes "
          "indistinguishable (while becoming domain-discriminative), the opposite of domain-adversarial training",
      cause_pattern=r"gradient revers\w*|GradReverse|\bGRL\b|revers\w* (layer|gradient).{0,60}(label|task|class)|"
                    r"(negated|reversed|flipped) (task |label |classification )?gradient|(feature extractor|encoder|"
                    r"features?).{0,60}(maximi[sz]|ascen|against the task)")
def defects_dann_gradient_reversal_before_label_head():
    return _dann(True)


fix("defects_dann_gradient_reversal_before_label_head", lambda: _dann(False), dann_acc, "val label accuracy")

# --------------------------------------------------------------------------------------------------------------
# W5: GPT-2 'head-only' probe: freezing the transformer freezes the tied lm_head too


def _gpt2_probe(tied=True):
    from transformers import GPT2Config, GPT2LMHeadModel
    seed(0)
    config = GPT2Config(vocab_size=40, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2,
                        tie_word_embeddings=tied)
    model = GPT2LMHeadModel(config)
    model.transformer.requires_grad_(False)                # probe: train the LM head (and the final norm) only
    model.transformer.ln_f.requires_grad_(True)
    from benchmarks.blind_preflight.registry import token_sequences
    ids = token_sequences(1024, 16, 40, s=141)
    ds = [{"input_ids": r, "attention_mask": torch.ones_like(r), "labels": r} for r in ids]
    collate = lambda b: {k: torch.stack([e[k] for e in b]) for k in b[0]}  # noqa: E731
    vids = token_sequences(128, 16, 40, s=142)
    val = [{"input_ids": r, "attention_mask": torch.ones_like(r), "labels": r} for r in vids]
    return dict(model=model, optimizer=torch.optim.AdamW(
                    [*model.lm_head.parameters(), *model.transformer.ln_f.parameters()], lr=5e-3),
                train_loader=loader(ds, 32, collate_fn=collate), val_loader=loader(val, 64, shuffle=False, collate_fn=collate),
                loss_fn=None, max_steps=300)


@torch.no_grad()
def lm_val_loss(model, kw):
    model.eval()
    losses = [model(**b).loss.item() for b in kw["val_loader"]]
    return sum(losses) / len(losses)


@case("gpt2_head_probe_frozen_transformer_freezes_tied_lm_head", "what_is_trained",
      bug="to probe with the LM head (and the final LayerNorm) only, model.transformer.requires_grad_(False) is "
          "called and the optimizer gets lm_head and ln_f; with tie_word_embeddings=True lm_head.weight IS "
          "transformer.wte.weight, so freezing the transformer froze the head too: only ln_f's 64 numbers train",
      cause_pattern=r"tie_word_embeddings|\btied\b|\btie[sd]?\b|weight tying|shares? (its |the )?(weight|storage|tensor)|"
                    r"lm_head.{0,60}(wte|embedding|frozen|requires_grad)|(no|zero) trainable param|"
                    r"(optimizer|optimiser).{0,60}(frozen|requires_grad ?= ?False)")
def gpt2_head_probe_frozen_transformer_freezes_tied_lm_head():
    return _gpt2_probe(True)


fix("gpt2_head_probe_frozen_transformer_freezes_tied_lm_head", lambda: _gpt2_probe(False), lm_val_loss,
    "val LM loss", higher=False,
    fact=lambda: (lambda m: print("  fact: lm_head.weight is wte.weight:", m.lm_head.weight is m.transformer.wte.weight,
                                  "| requires_grad:", m.lm_head.weight.requires_grad))(_gpt2_probe(True)["model"]))

# --------------------------------------------------------------------------------------------------------------
# W6: LoRA adapters injected with setattr(model, 'encoder.0', ...) on the root


W_BASE = torch.linalg.qr(torch.randn(16, 16, generator=gen(151)))[0]


def tickets(n, s):
    g = gen(s)
    x = torch.randn(n, 16, generator=g)
    y = (x @ W_BASE[:, 8:11]).argmax(1)                   # the label lives outside the base encoder's span
    return x, y


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, r=4, alpha=4.0):
        super().__init__()
        self.base = base
        self.A = nn.Parameter(torch.randn(r, base.in_features) * 0.1)
        self.B = nn.Parameter(torch.zeros(base.out_features, r))
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + (x @ self.A.T @ self.B.T) * self.scale


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 8), nn.ReLU())
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.encoder(x))


def _lora(root_setattr=True):
    seed(0)
    x, y = tickets(2048, 152)
    vx, vy = tickets(512, 153)
    model = Tagger()
    with torch.no_grad():                                 # the 'pretrained' encoder
        model.encoder[0].weight.copy_(W_BASE[:, :8].T * 2)
        model.encoder[0].bias.fill_(0.5)
    model.requires_grad_(False)
    model.head.requires_grad_(True)
    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith("encoder")]
    for name, module in targets:
        if root_setattr:
            setattr(model, name, LoRALinear(module))
        else:
            parent, child = name.rsplit(".", 1)
            setattr(model.get_submodule(parent), child, LoRALinear(module))
    params = [p for p in model.parameters() if p.requires_grad]
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=5e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@case("ticket_lora_adapters_set_on_root_by_dotted_name", "what_is_trained",
      bug="the LoRA injection loop does setattr(model, name, LoRALinear(module)) with the dotted name 'encoder.0': "
          "that registers a NEW root attribute literally called 'encoder.0' instead of replacing model.encoder[0], "
          "so the adapters are in model.parameters() and the optimizer but not on the forward path: they get no "
          "gradient and the frozen encoder is never adapted",
      cause_pattern=r"setattr|dotted|'encoder\.0'|get_submodule|lora|adapter\w*.{0,80}(forward|not used|unused|no grad|"
                    r"never)|not (used|called) in (the )?forward|(no|zero|none) grad\w*.{0,60}(A|B|lora|adapter)")
def ticket_lora_adapters_set_on_root_by_dotted_name():
    return _lora(True)


fix("ticket_lora_adapters_set_on_root_by_dotted_name", lambda: _lora(False), val_acc, "val accuracy",
    fact=lambda: print("  fact: root children after injection:", [n for n, _ in _lora(True)["model"].named_children()]))
