"""Set j, family what_is_trained: parameters, freezing, optimizer groups, initialisation and registration."""

from __future__ import annotations

import copy

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


def _nonlinear_classes(n, d, c, s, hidden=32, scale=3.0):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w1 = torch.randn(d, hidden, generator=g) / d ** 0.5
    w2 = torch.randn(hidden, c, generator=g)
    return x, (torch.tanh(x @ w1 * 1.5) @ w2 * scale).argmax(1)


# --------------------------------------------------------------------------------------------------------------------
# 1. nn.init.uniform_ with its default range [0, 1)


class DeepMLP(nn.Module):
    def __init__(self, d=24, width=64, depth=4, c=4, init_uniform_default=False):
        super().__init__()
        layers, last = [], d
        for _ in range(depth):
            layers += [nn.Linear(last, width), nn.ReLU()]
            last = width
        self.net = nn.Sequential(*layers, nn.Linear(last, c))
        if init_uniform_default:
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.uniform_(m.weight)            # meant: a symmetric U(-a, a); the default is U(0, 1)
                    nn.init.zeros_(m.bias)
        else:
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    bound = (6 / (m.in_features + m.out_features)) ** 0.5
                    nn.init.uniform_(m.weight, -bound, bound)
                    nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.net(x)


@case("claims_mlp_init_uniform_default_zero_to_one", "what_is_trained",
      "init_weights() calls nn.init.uniform_(m.weight) without bounds, meant as a small symmetric uniform init; the "
      "defaults are a=0, b=1, so every weight is positive in [0, 1): all hidden units of a layer compute nearly the "
      "same large positive sum, the activations grow layer by layer and the units stay almost identical",
      r"uniform_|nn\.init\.uniform|uniform init\w*|\[0, ?1\)|U\(0, ?1\)|(all|every)[^.]*weights?[^.]*positiv"
      r"e|positive (weights|init)|init\w*[^.]*(all.positive|symmetric)")

def claims_mlp_init_uniform_default_zero_to_one(fixed: bool = False):
    seed(0)
    x, y = _nonlinear_classes(3000, 24, 4, s=60)
    model = DeepMLP(init_uniform_default=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 64),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=400)


def _fact_uniform():
    w = nn.init.uniform_(torch.empty(64, 64))
    h = torch.relu(torch.randn(8, 64) @ w.T)
    print(f"  uniform_() range [{w.min().item():.3f}, {w.max().item():.3f}); hidden units' correlation across units "
          f"{torch.corrcoef(h.T).nan_to_num().mean().item():.2f}")


fix("claims_mlp_init_uniform_default_zero_to_one", lambda: claims_mlp_init_uniform_default_zero_to_one(fixed=True),
    _val_acc, "val accuracy", _fact_uniform, steps=400)


# --------------------------------------------------------------------------------------------------------------------
# 2. "freeze all but the last layer" with list(model.parameters())[:-1]


class FeatureExtractorWithHead(nn.Module):
    def __init__(self, d=16, c=6):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(d, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.head = nn.Linear(64, c)

    def forward(self, x):
        return self.head(self.backbone(x))


def _pretrained_backbone_task(n=3000, s=70):
    """Labels are a linear function of the frozen backbone's features: a linear probe is all the task needs."""
    torch.manual_seed(71)
    model = FeatureExtractorWithHead()
    state = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    g = gen(s)
    x = torch.randn(n, 16, generator=g)
    with torch.no_grad():
        feats = model.backbone(x)
    w = torch.randn(64, 6, generator=g)
    y = (feats @ w).argmax(1)
    return state, x, y


@case("probe_freeze_slice_leaves_only_head_bias", "what_is_trained",
      "the linear probe freezes 'everything but the last layer' with for p in list(model.parameters())[:-1]: "
      "parameters() ends with the head's weight and then its bias, so the slice freezes the head's weight too; only "
      "the 6 bias values are trainable and the probe can never use the features",
      r"\[:-1\]|slice|last (param|tensor)|head'?s? weight[^.]*(frozen|requires_grad|not trainable)|only (the"
      r" )?(head'?s? )?bias(es)? (values? )?(is |are )?trainable")

def probe_freeze_slice_leaves_only_head_bias(fixed: bool = False):
    seed(0)
    state, x, y = _pretrained_backbone_task()
    model = FeatureExtractorWithHead()
    model.backbone.load_state_dict(state)
    frozen = list(model.backbone.parameters()) if fixed else list(model.parameters())[:-1]
    for p in frozen:
        p.requires_grad = False
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 64),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


def _fact_slice():
    m = FeatureExtractorWithHead()
    names = [n for n, _ in m.named_parameters()]
    print("  parameters():", names, "-> [:-1] keeps trainable only:", names[-1:])


fix("probe_freeze_slice_leaves_only_head_bias", lambda: probe_freeze_slice_leaves_only_head_bias(fixed=True),
    _val_acc, "val accuracy", _fact_slice, steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 3. mean-teacher "copy" of the encoder that is an alias: freezing the teacher freezes the student's encoder


class ConsistencyClassifier(nn.Module):
    def __init__(self, d=24, c=4, alias_teacher=False):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, c)
        self.teacher_encoder = [self.encoder if alias_teacher else copy.deepcopy(self.encoder)]  # kept out of
        for p in self.teacher_encoder[0].parameters():                                          # the parameters
            p.requires_grad = False

    def forward(self, x):
        return self.head(self.encoder(x))

    @torch.no_grad()
    def update_teacher(self, decay=0.99):
        for t, s in zip(self.teacher_encoder[0].parameters(), self.encoder.parameters()):
            t.mul_(decay).add_(s.detach(), alpha=1 - decay)


def consistency_loss(model, batch):
    x, y = batch
    model.teacher_encoder[0].to(x.device)
    model.update_teacher()
    noisy = x + 0.1 * torch.randn_like(x)
    with torch.no_grad():
        target_feats = model.teacher_encoder[0](x)
    feats = model.encoder(noisy)
    return F.cross_entropy(model.head(feats), y) + 0.1 * F.mse_loss(feats, target_feats)


@case("mean_teacher_encoder_alias_freezes_student", "what_is_trained",
      "the mean-teacher encoder is made with teacher = model.encoder (an alias; copy.deepcopy(model.encoder) was meant) "
      "and then frozen with requires_grad = False: the teacher and the student share the same parameter tensors, so the "
      "student's encoder is frozen at its random init and only the linear head trains",
      r"alias|deep.?copy|copy\.deepcopy|same (object|module|parameters?|tensors?)|shar(e|es|ed|ing) (the )?(same )?"
      r"(parameters?|weights?|tensors?)|encoder[^.]*(frozen|requires_grad|never (updated|trained)|not trainable)")
def mean_teacher_encoder_alias_freezes_student(fixed: bool = False):
    seed(0)
    x, y = _nonlinear_classes(3000, 24, 4, s=80, hidden=48, scale=4.0)
    model = ConsistencyClassifier(alias_teacher=not fixed)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 64),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 250, shuffle=False),
                loss_fn=consistency_loss, max_steps=400)


def _fact_alias():
    m = ConsistencyClassifier(alias_teacher=True)
    print("  teacher is model.encoder:", m.teacher_encoder[0] is m.encoder, "; trainable:",
          [n for n, p in m.named_parameters() if p.requires_grad])


fix("mean_teacher_encoder_alias_freezes_student", lambda: mean_teacher_encoder_alias_freezes_student(fixed=True),
    _val_acc, "val accuracy", _fact_alias, steps=400)


# --------------------------------------------------------------------------------------------------------------------
# 4. zero_init_residual-style BatchNorm zeroing applied to a CNN without residual connections


def _stripes(n=2000, s=90):
    """4 classes of 16x16 images: horizontal / vertical / two diagonal stripe patterns with random phase, noisy."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    coord = torch.stack([yy, xx, yy + xx, yy - xx])[y]
    phase = torch.rand(n, 1, 1, generator=g) * 6.28
    img = torch.sin(coord * 1.2 + phase) + 0.8 * torch.randn(n, 16, 16, generator=g)
    return img.unsqueeze(1), y


class PlainBNCNN(nn.Module):
    def __init__(self, zero_all_bn=False):
        super().__init__()
        def block(i, o):
            return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]
        self.features = nn.Sequential(*block(1, 16), *block(16, 16), nn.MaxPool2d(2), *block(16, 32), *block(32, 32),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, 4)
        if zero_all_bn:
            for m in self.modules():                     # "zero_init_residual" from a ResNet recipe
                if isinstance(m, nn.BatchNorm2d):
                    nn.init.zeros_(m.weight)

    def forward(self, x):
        return self.fc(self.features(x))


@case("stripes_cnn_every_batchnorm_gamma_zeroed", "what_is_trained",
      "the ResNet recipe's zero_init_residual trick is applied as 'for every BatchNorm2d: zeros_(m.weight)' in a plain "
      "CNN with NO residual connections: every BatchNorm output is 0 (gamma = 0, beta = 0), the ReLU after it passes no "
      "gradient at 0, so the network outputs a constant and no convolution or BatchNorm ever gets a gradient: only "
      "the fc bias trains",
      r"zero.?init|gamma\s*=\s*0|gammas? (to |at |set to )?zero|batch.?norm\w*[^.]*(zero|gamma|scale|weight)"
      r"|\bbn\b[^.]*(zero|gamma|scale|weight)|residual (connection|trick|branch)|constant output|(zero|no) g"
      r"rad\w*[^.]*conv|conv\w*[^.]*(zero|no) grad")

def stripes_cnn_every_batchnorm_gamma_zeroed(fixed: bool = False):
    seed(0)
    x, y = _stripes()
    model = PlainBNCNN(zero_all_bn=not fixed)
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=150)


def _fact_bn_zero():
    torch.manual_seed(0)
    m = PlainBNCNN(zero_all_bn=True)
    x, y = _stripes(64)
    F.cross_entropy(m(x), y).backward()
    conv_grad = sum(p.grad.abs().sum().item() for n, p in m.named_parameters() if p.dim() == 4)
    print(f"  all BN gammas zero: logits spread {m(x).std(0).sum().item():.2e}, |grad| summed over the convs "
          f"{conv_grad:.2e}")


fix("stripes_cnn_every_batchnorm_gamma_zeroed", lambda: stripes_cnn_every_batchnorm_gamma_zeroed(fixed=True),
    _val_acc, "val accuracy", _fact_bn_zero, steps=150)


# --------------------------------------------------------------------------------------------------------------------
# 5. learned position table created with requires_grad=False (left from the sinusoidal version) at zeros

T_ORD, V_ORD = 12, 20


def _order_pairs(n=3000, s=100):
    """Two marker tokens A (1) and B (2) among fillers; the label is whether A comes before B."""
    g = gen(s)
    tok = torch.randint(3, V_ORD, (n, T_ORD), generator=g)
    perm = torch.argsort(torch.rand(n, T_ORD, generator=g), dim=1)[:, :2]
    tok[torch.arange(n), perm[:, 0]] = 1
    tok[torch.arange(n), perm[:, 1]] = 2
    return tok, (perm[:, 0] < perm[:, 1]).long()


class OrderTransformer(nn.Module):
    def __init__(self, d=32, learn_positions=True):
        super().__init__()
        self.emb = nn.Embedding(V_ORD, d)
        self.pos = nn.Parameter(torch.zeros(1, T_ORD, d), requires_grad=learn_positions)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 2)

    def forward(self, tok):
        h = self.encoder(self.emb(tok) + self.pos[:, :tok.size(1)])
        return self.head(h.mean(1))


@case("marker_order_transformer_position_table_frozen_at_zero", "what_is_trained",
      "the learned position table is nn.Parameter(torch.zeros(1, T, d), requires_grad=False), the flag kept from the "
      "fixed sinusoidal table it replaced: it stays all zeros, the encoder has no position information at all (self-"
      "attention with mean pooling is permutation invariant), so whether A comes before B cannot be learned",
      r"position\w*[^.]*(frozen|requires_grad|zeros?\b|never (updated|trained)|not (trained|learn))|"
      r"permutation.?invariant|no (position|order)\w* (information|signal)|(pos|positional) (embedding|encoding|table)")
def marker_order_transformer_position_table_frozen_at_zero(fixed: bool = False):
    seed(0)
    tok, y = _order_pairs()
    model = OrderTransformer(learn_positions=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(tok[:2500], y[:2500]), 64),
                val_loader=loader(TensorDataset(tok[2500:], y[2500:]), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=400)


def _fact_pos():
    m = OrderTransformer(learn_positions=False).eval()
    tok = torch.tensor([[1, 5, 2, 7, 8, 9, 3, 4, 10, 11, 12, 13]])
    swapped = tok.clone()
    swapped[0, 0], swapped[0, 2] = 2, 1
    print(f"  frozen zero positions: |logits(A before B) - logits(B before A)| = "
          f"{(m(tok) - m(swapped)).abs().max().item():.2e}; pos.requires_grad = {m.pos.requires_grad}")


fix("marker_order_transformer_position_table_frozen_at_zero",
    lambda: marker_order_transformer_position_table_frozen_at_zero(fixed=True),
    _val_acc, "val accuracy", _fact_pos, steps=400)
