"""Set aa, family what_is_trained: the parameters that should learn are not the ones the optimizer updates (or get
no gradient), in transfer-learning, residual, counting and autoencoder code."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_aa.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mae_of,
    rmse_of,
    seed,
    tone_clips,
)


def color_patch_images(n: int, size: int = 16, s: int = 0):
    """(n, 3, size, size): a 6x6 patch whose colour is the class (red, green, blue, yellow) on a noisy grey tile."""
    g = gen(s)
    colours = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 1.0, 0]])
    y = torch.randint(0, 4, (n,), generator=g)
    img = 0.5 * torch.randn(n, 3, size, size, generator=g)
    for i in range(n):
        top, left = torch.randint(0, size - 6, (2,), generator=g).tolist()
        img[i, :, top:top + 6, left:left + 6] += 1.5 * colours[y[i]][:, None, None]
    return img, y


class PretrainedBackboneNet(nn.Module):
    """Stands in for a torchvision model: a 'pretrained' feature extractor and an ImageNet head called fc."""

    def __init__(self):
        super().__init__()
        g = gen(99)
        self.features = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten())
        with torch.no_grad():                                   # the "checkpoint": fixed filters
            self.features[0].weight.copy_(torch.randn(32, 3, 3, 3, generator=g) * 0.3)
            self.features[0].bias.zero_()
        self.fc = nn.Linear(128, 1000)

    def forward(self, x):
        return self.fc(self.features(x))


# ------------------------------------------------------------------------------------------------------------------
# 11. Transfer learning: optimizer built on model.fc, then model.fc replaced by the new 4-class head.
# ------------------------------------------------------------------------------------------------------------------

@case("head_swapped_after_optimizer", "what_is_trained",
      bug="The backbone is frozen and the optimizer is built on model.fc.parameters() of the 1000-class ImageNet head; "
          "the new 4-class nn.Linear is assigned to model.fc afterwards, so the optimizer still holds the old, "
          "detached head's tensors and the new head's weights are never updated.",
      cause_pattern=r"(optimi[sz]er|param(eter)?_?groups?).{0,120}(old|stale|replaced|previous|detached|no longer (in|part of)|not in the model)"
                    r"|(new|replaced|reassigned) (head|layer|module|classifier|fc).{0,80}not (in|part of|registered with) the optimi[sz]er"
                    r"|(parameters?|weights?|head|layer|fc) .{0,60}not in (the )?optimi[sz]er"
                    r"|(re-?)?(create|rebuild|construct|build) the optimi[sz]er after"
                    r"|optimi[sz]er (was )?(created|built|constructed) before")
def head_swapped_after_optimizer(fixed: bool = False):
    seed(0)
    x, y = color_patch_images(896, s=31)
    model = PretrainedBackboneNet()
    for p in model.parameters():
        p.requires_grad = False
    if fixed:
        model.fc = nn.Linear(128, 4)
        optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.05, momentum=0.9)
    else:
        model.fc.weight.requires_grad = True
        model.fc.bias.requires_grad = True
        optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.05, momentum=0.9)
        model.fc = nn.Linear(128, 4)                            # our 4 classes
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:768], y[:768]), 32),
                val_loader=loader(TensorDataset(x[768:], y[768:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


fix("head_swapped_after_optimizer", fixed_of(head_swapped_after_optimizer),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val acc")


# ------------------------------------------------------------------------------------------------------------------
# 12. ReZero residual blocks: the zero-initialised gate is a plain tensor, not an nn.Parameter.
# ------------------------------------------------------------------------------------------------------------------

class ReZeroBlock(nn.Module):
    def __init__(self, dim: int, registered: bool = False):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))
        if registered:
            self.alpha = nn.Parameter(torch.zeros(1))
        else:
            self.alpha = torch.zeros(1, requires_grad=True)     # residual gate, starts at 0 (ReZero)

    def forward(self, x):
        return x + self.alpha.to(x.device) * self.f(x)


class BandEnergyNet(nn.Module):
    def __init__(self, registered: bool = False):
        super().__init__()
        self.stem = nn.Linear(32, 64)
        self.blocks = nn.Sequential(*[ReZeroBlock(64, registered) for _ in range(3)])
        self.head = nn.Linear(64, 2)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


@case("rezero_gate_plain_tensor", "what_is_trained",
      bug="Each ReZero block's residual gate is self.alpha = torch.zeros(1, requires_grad=True), a plain tensor "
          "attribute rather than an nn.Parameter: it is not in model.parameters(), the optimizer never updates it, it "
          "stays 0, so every residual branch is multiplied by 0 (and gets zero gradient) and the network stays linear.",
      cause_pattern=r"nn\.Parameter|not (a |an )?(registered )?(parameter|Parameter)|(plain|bare|raw|ordinary) tensor"
                    r"|not (in|part of|returned by) (model\.)?parameters\(\)|unregistered|register_parameter"
                    r"|\balpha\b.{0,80}(parameter|registered|optimi[sz]er|never|not)|residual (gate|scale)|ReZero|LayerScale")
def rezero_gate_plain_tensor(fixed: bool = False):
    seed(0)
    g = gen(32)
    x = torch.randn(1536, 32, generator=g)
    energy = (x[:, :8] ** 2).sum(1) - (x[:, 8:16] ** 2).sum(1)    # low bands vs high bands: a bearing fault
    y = (energy > 0).long()
    model = BandEnergyNet(registered=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1280], y[:1280]), 32),
                val_loader=loader(TensorDataset(x[1280:], y[1280:]), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("rezero_gate_plain_tensor", fixed_of(rezero_gate_plain_tensor),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val acc")


# ------------------------------------------------------------------------------------------------------------------
# 13. Object counting: forward() returns torch.round(...) so the counts are integers; round has zero gradient.
# ------------------------------------------------------------------------------------------------------------------

def dot_count_images(n: int, size: int = 16, s: int = 0):
    g = gen(s)
    counts = torch.randint(0, 7, (n,), generator=g)
    img = 0.3 * torch.randn(n, 1, size, size, generator=g)
    for i in range(n):
        cells = torch.randperm(16, generator=g)[:int(counts[i])]
        for c in cells.tolist():
            r, col = divmod(c, 4)
            img[i, 0, r * 4 + 1:r * 4 + 3, col * 4 + 1:col * 4 + 3] += 2.0
    return img, counts.float()


class DotCounter(nn.Module):
    def __init__(self, round_output: bool = True):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 1))
        self.round_output = round_output

    def forward(self, x):
        count = self.net(x).squeeze(-1) * 8.0
        return torch.round(count) if self.round_output else count    # counts are whole numbers


@case("round_in_forward_count", "what_is_trained",
      bug="The counting model's forward returns torch.round(count) so that it predicts whole numbers; round is a step "
          "function whose gradient is zero everywhere, so the MSE loss sends no gradient to any weight and nothing "
          "trains (the loss is not detached, it just has zero gradient).",
      cause_pattern=r"torch\.round|\.round\(\)|round(ing)? (in|inside) (the )?(forward|model|output)|\bround\w*.{0,60}(zero|no) gradient"
                    r"|torch\.floor|torch\.ceil|step function|piecewise[- ]constant"
                    r"|zero gradient (everywhere|almost everywhere)|gradients? (are|is) (all |exactly )?zero"
                    r"|straight[- ]through")
def round_in_forward_count(fixed: bool = False):
    seed(0)
    x, y = dot_count_images(896, s=33)
    model = DotCounter(round_output=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:768], y[:768]), 32),
                val_loader=loader(TensorDataset(x[768:], y[768:]), 128, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1500)


fix("round_in_forward_count", fixed_of(round_in_forward_count),
    mae_of(lambda m, b: (m(b[0]).round(), b[1])), "val count MAE", higher=False)


# ------------------------------------------------------------------------------------------------------------------
# 14. Anomaly-detection autoencoder: the optimizer gets model.decoder.parameters() only (copied from a repo
#     whose encoder was pretrained and frozen); here the encoder is fresh and stays random.
# ------------------------------------------------------------------------------------------------------------------

class WindowAE(nn.Module):
    def __init__(self, dim: int = 64, code: int = 4):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, code))
        self.decoder = nn.Sequential(nn.Linear(code, 32), nn.ReLU(), nn.Linear(32, dim))

    def forward(self, x):
        return self.decoder(self.encoder(x))


def normal_vibration(n: int, dim: int = 64, s: int = 0):
    """Normal operation: each window mixes 4 machine harmonics with random amplitudes, plus sensor noise."""
    g = gen(s)
    t = torch.arange(dim).float()
    basis = torch.stack([torch.sin(2 * math.pi * f * t / dim + ph) for f, ph in ((1, 0.3), (3, 1.1), (5, 2.0), (8, 0.7))])
    coef = torch.randn(n, 4, generator=g) * torch.tensor([1.5, 1.0, 0.8, 0.6])
    return coef @ basis + 0.1 * torch.randn(n, dim, generator=g)


def reconstruction_mse(model, batch):
    (x,) = batch
    return F.mse_loss(model(x), x)


@case("ae_optimizer_decoder_only", "what_is_trained",
      bug="The autoencoder's optimizer is built on model.decoder.parameters() only (the snippet came from a repo "
          "whose encoder was pretrained and frozen); here the encoder is freshly initialised, gets gradients but is "
          "never updated, so the decoder must reconstruct from a random 4-number code.",
      cause_pattern=r"encoder.{0,120}(not|never) (in|updated|optimi[sz]ed|passed|trained|part of)"
                    r"|(not|never) (in|updated|optimi[sz]ed|passed|trained).{0,60}encoder"
                    r"|decoder\.parameters\(\)|only (the )?decoder|(gets?|receives?|has) gradients? but (is )?(not|never) (updated|in the optimi[sz]er)"
                    r"|(parameters?|weights?) .{0,60}not in (the )?optimi[sz]er")
def ae_optimizer_decoder_only(fixed: bool = False):
    seed(0)
    x = normal_vibration(1536, s=34)
    model = WindowAE()
    params = model.parameters() if fixed else model.decoder.parameters()
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=3e-3),
                train_loader=loader(TensorDataset(x[:1280]), 32),
                val_loader=loader(TensorDataset(x[1280:]), 256, shuffle=False),
                loss_fn=reconstruction_mse, max_steps=3000)


fix("ae_optimizer_decoder_only", fixed_of(ae_optimizer_decoder_only),
    rmse_of(lambda m, b: (m(b[0]), b[0])), "val reconstruction RMSE", higher=False)


# ------------------------------------------------------------------------------------------------------------------
# 15. Freezing by name: "train only the parameters whose name contains 'fc'", on a model whose head is 'classifier'.
# ------------------------------------------------------------------------------------------------------------------

class SqueezeExcite1d(nn.Module):
    """torchvision's SqueezeExcitation naming: fc1 / fc2 are the 1x1 convs of the channel gate."""

    def __init__(self, ch: int, squeeze: int = 8):
        super().__init__()
        self.fc1 = nn.Conv1d(ch, squeeze, 1)
        self.fc2 = nn.Conv1d(squeeze, ch, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.fc2(F.relu(self.fc1(x.mean(-1, keepdim=True)))))


class KeywordSpotter(nn.Module):
    """MobileNetV3-style naming: features (with a squeeze-excite block) + classifier; the features stand in for a
    pretrained audio front end."""

    def __init__(self, classes: int = 6):
        super().__init__()
        g = gen(98)
        self.features = nn.Sequential(nn.Conv1d(1, 48, 15, padding=7), nn.ReLU(), SqueezeExcite1d(48),
                                      nn.AdaptiveAvgPool1d(1), nn.Flatten())
        with torch.no_grad():                                   # "pretrained": a bank of tuned filters
            t = torch.arange(15).float()
            freqs = torch.linspace(0.03, 0.4, 24)
            w = torch.cat([torch.sin(2 * math.pi * freqs[:, None] * t), torch.cos(2 * math.pi * freqs[:, None] * t)])
            self.features[0].weight.copy_(w[:, None, :] * 0.3 + 0.01 * torch.randn(48, 1, 15, generator=g))
            self.features[0].bias.fill_(-0.3)
        self.classifier = nn.Linear(48, classes)

    def forward(self, x):
        return self.classifier(self.features(x))


@case("freeze_by_name_fc_vs_classifier", "what_is_trained",
      bug="The fine-tuning loop freezes every parameter whose name does not contain 'fc' (the ResNet recipe), but "
          "this model's head is named 'classifier': the new random head is frozen, and the only parameters left "
          "trainable are the squeeze-excite gate's features.2.fc1 / fc2, which happen to contain 'fc'.",
      cause_pattern=r"(head|classifier|output layer|last layer|final layer)('s)? (weights |parameters )?(is |are |was |stays |remains )?(frozen|requires_grad ?= ?False|not trainable)"
                    r"|(frozen|requires_grad ?= ?False on|not trainable:?) (the |its |a )?(new |random )?(head|classifier|output layer|last layer|final layer)"
                    r"|['\"]fc['\"]|fc1|fc2|squeeze[- ]excit\w*|\bSE\b (block|gate)"
                    r"|(name|substring) (filter|match|check).{0,80}(freez|frozen|head|classifier)")
def freeze_by_name_fc_vs_classifier(fixed: bool = False):
    seed(0)
    x, y = tone_clips(896, s=35, classes=6)
    model = KeywordSpotter(classes=6)
    keep = "classifier" if fixed else "fc"
    for name, p in model.named_parameters():
        if keep not in name:
            p.requires_grad = False
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x[:768], y[:768]), 32),
                val_loader=loader(TensorDataset(x[768:], y[768:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


fix("freeze_by_name_fc_vs_classifier", fixed_of(freeze_by_name_fc_vs_classifier),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val acc")
