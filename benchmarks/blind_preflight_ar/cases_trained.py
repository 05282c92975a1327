"""Set ar, family what_is_trained: the weights the run updates are not the ones that matter."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ar.registry import (
    TAU,
    case,
    fix,
    fixed_of,
    gen,
    har_windows,
    loader,
    log_mel,
    own_val,
    rmse_on,
    seed,
    sine_series,
    val_acc,
    windows,
)


@case("optimizer_before_head_swap", "what_is_trained",
      bug="The optimizer is built from the frozen 'pretrained' audio model's parameters, and only afterwards is "
          "model.head replaced by a new nn.Linear for the new classes, so the new head is not in the optimizer and "
          "never updates.",
      cause_pattern=r"(head|classifier|fc|new (layer|linear|module))\w*.{0,80}not (in|part of|registered (with|in)|"
                    r"passed to|known to|included in) (the )?optimi[sz]er|optimi[sz]er.{0,80}(before|prior to).{0,80}"
                    r"(replac|swap|reassign|new head|new layer)|(replac|swap|reassign)\w*.{0,80}after.{0,40}"
                    r"optimi[sz]er|(never|not) (updated|stepped|optimi[sz]ed|trained).{0,60}(head|classifier)|"
                    r"(re)?(build|create|construct) the optimi[sz]er after|optimi[sz]er.{0,80}(old|stale|previous|"
                    r"replaced|original) (head|classifier|layer|parameters)")
def optimizer_before_head_swap(fixed: bool = False):
    seed(0)
    x, y = log_mel(1400, s=41)
    x = x.mean(-1)                                     # clip-level mel profile (n, 16)

    class AudioTagger(nn.Module):
        def __init__(self, n_out):
            super().__init__()
            self.backbone = nn.Sequential(nn.Linear(16, 48), nn.ReLU())
            self.head = nn.Linear(48, n_out)

        def forward(self, x):
            return self.head(self.backbone(x))

    model = AudioTagger(527)                           # "pretrained" tagger with its original label set
    for p in model.parameters():
        p.requires_grad = False                        # linear probe: freeze everything
    if fixed:
        model.head = nn.Linear(48, 5)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        model.head = nn.Linear(48, 5)                  # new head for the 5 target classes
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 64), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 200, shuffle=False), max_steps=300)


fix("optimizer_before_head_swap", fixed_of(optimizer_before_head_swap), val_acc, "val accuracy")


def _sensor_windows(n, s, L=64):
    """Healthy vibration windows: two machine tones with random amplitude and phase (a 4-d subspace), small noise."""
    g = gen(s)
    t = torch.arange(L).float()
    a = 0.5 + torch.rand(n, 2, 1, generator=g)
    ph = TAU * torch.rand(n, 2, 1, generator=g)
    f = torch.tensor([1 / 16, 1 / 6]).view(1, 2, 1)
    return (a * torch.sin(TAU * f * t + ph)).sum(1) + 0.05 * torch.randn(n, L, generator=g)


class WindowAE(nn.Module):
    def __init__(self, L=64, code=4, out_act=None):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(L, 32), nn.ReLU(), nn.Linear(32, code))
        self.decoder = nn.Sequential(nn.Linear(code, 32), nn.ReLU(), nn.Linear(32, L))
        self.out_act = out_act

    def forward(self, x):
        r = self.decoder(self.encoder(x))
        return self.out_act(r) if self.out_act is not None else r


@case("ae_optimizer_encoder_only", "what_is_trained",
      bug="The sensor autoencoder's optimizer is given model.encoder.parameters() only, so the decoder keeps its "
          "random initial weights and reconstructions can only come from a random decoder.",
      cause_pattern=r"decoder\w*.{0,80}(not (in|part of|passed to|included in|given to)|missing from|never (updated|"
                    r"trained|stepped|optimi[sz]ed)|random|frozen|left out)|encoder\.parameters\(\)|optimi[sz]er.{0,60}"
                    r"only.{0,40}encoder|only (the )?encoder.{0,60}(optimi[sz]|train|updat)")
def ae_optimizer_encoder_only(fixed: bool = False):
    seed(0)
    x = _sensor_windows(1500, s=42)
    model = WindowAE()
    params = model.parameters() if fixed else model.encoder.parameters()
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=2e-3),
                train_loader=loader(TensorDataset(x[:1200], x[:1200]), 64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(x[1200:], x[1200:]), 300, shuffle=False), max_steps=300)


fix("ae_optimizer_encoder_only", fixed_of(ae_optimizer_encoder_only),
    rmse_on(own_val, lambda m, b: (m(b[0]), b[0])), "val reconstruction RMSE", higher=False)


@case("ar_coefficients_plain_tensor", "what_is_trained",
      bug="The AR forecaster's lag coefficients are a plain tensor created with requires_grad=True and stored as a "
          "module attribute, not an nn.Parameter, so model.parameters() and the optimizer only see the bias.",
      cause_pattern=r"nn\.Parameter|register_parameter|plain (torch\.)?tensor|(not|isn't|is not) (a |an )?(registered )?"
                    r"(nn\.)?parameter|(attribute|tensor).{0,60}(not registered|unregistered|not in model\.parameters|"
                    r"not returned by (model\.)?parameters|missing from (model\.)?parameters)")
def ar_coefficients_plain_tensor(fixed: bool = False):
    seed(0)
    x, y = windows(sine_series(30, 200, s=43), 16, 1, stride=2)
    n = int(0.8 * len(x))

    class LinearAR(nn.Module):
        def __init__(self, lags=16):
            super().__init__()
            coef = torch.zeros(lags, 1)
            if fixed:
                self.coef = nn.Parameter(coef)
            else:
                self.coef = coef.requires_grad_()
            self.bias = nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return x @ self.coef.to(x.device) + self.bias

    model = LinearAR()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x[:n], y[:n]), 64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(x[n:], y[n:]), 256, shuffle=False), max_steps=300)


fix("ar_coefficients_plain_tensor", fixed_of(ar_coefficients_plain_tensor),
    rmse_on(own_val, lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


@case("encoder_under_no_grad", "what_is_trained",
      bug="The forecaster runs its GRU encoder inside torch.no_grad() (pasted from the inference code), so no "
          "gradient reaches the encoder and only the linear head learns, on top of random recurrent features.",
      cause_pattern=r"no_grad|inference_mode|(no|zero|without) (gradient|grad)s?.{0,60}(encoder|gru|recurrent|"
                    r"backbone)|(encoder|gru|backbone)\w*.{0,60}(no|zero|without|never (gets|receives)) (gradient|grad)|"
                    r"(gradient|graph)s?.{0,40}(cut|blocked|disabled|stopped).{0,40}(encoder|gru)|encoder\w*.{0,80}"
                    r"\.?grad (is|are|stays|remains) None")
def encoder_under_no_grad(fixed: bool = False):
    seed(0)
    x, y = windows(sine_series(40, 150, s=44), 24, 4, stride=2)
    n = int(0.8 * len(x))

    class Forecaster(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.GRU(1, 8, batch_first=True)
            self.head = nn.Linear(8, 4)

        def forward(self, x):
            if fixed:
                _, h = self.encoder(x.unsqueeze(-1))
            else:
                with torch.no_grad():
                    _, h = self.encoder(x.unsqueeze(-1))
            return self.head(h[-1])

    model = Forecaster()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:n], y[:n]), 64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(x[n:], y[n:]), 256, shuffle=False), max_steps=300)


fix("encoder_under_no_grad", fixed_of(encoder_under_no_grad),
    rmse_on(own_val, lambda m, b: (m(b[0]), b[1])), "val 4-step RMSE", higher=False)


@case("classifier_wraps_encoder_copy", "what_is_trained",
      bug="The activity classifier wraps copy.deepcopy(encoder) while the optimizer is built from the original "
          "encoder's parameters plus the head, so the encoder the model actually runs is never updated.",
      cause_pattern=r"deep ?copy|copy\.deepcopy|(a |the )?copy of the encoder|(different|other|original|separate) "
                    r"(encoder|module|instance|object).{0,80}(optimi[sz]er|parameters)|optimi[sz]er.{0,80}(different|"
                    r"other|original|separate|stale) (encoder|module|instance|object|parameters|copy)|encoder\w*.{0,80}not "
                    r"(in|part of|passed to|known to|included in|registered (with|in)) (the )?optimi[sz]er|optimi[sz]er"
                    r".{0,80}(parameters|tensors) (that are )?not (in|part of|used by|used in) the model")
def classifier_wraps_encoder_copy(fixed: bool = False):
    seed(0)
    x, y = har_windows(1400, T=48, C=3, n_classes=5, s=45)

    encoder = nn.Sequential(nn.Conv1d(3, 6, 5, padding=2), nn.ReLU(), nn.Conv1d(6, 6, 5, padding=2), nn.ReLU(),
                            nn.AdaptiveAvgPool1d(1), nn.Flatten())
    head = nn.Linear(6, 5)

    class Classifier(nn.Module):
        def __init__(self, enc, head):
            super().__init__()
            self.encoder = enc
            self.head = head

        def forward(self, x):                    # (B, T, C)
            return self.head(self.encoder(x.transpose(1, 2)))

    # "keep the SSL-pretrained encoder intact" -> the classifier gets a copy
    model = Classifier(encoder if fixed else copy.deepcopy(encoder), head)
    optimizer = torch.optim.Adam(list(encoder.parameters()) + list(head.parameters()), lr=3e-3)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 64), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 200, shuffle=False), max_steps=300)


fix("classifier_wraps_encoder_copy", fixed_of(classifier_wraps_encoder_copy), val_acc, "val accuracy")
