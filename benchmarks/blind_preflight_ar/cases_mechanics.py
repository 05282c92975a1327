"""Set ar, family mechanics: the forward / backward / schedule does not do what the user thinks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ar.cases_trained import WindowAE, _sensor_windows
from benchmarks.blind_preflight_ar.registry import (
    case,
    fix,
    fixed_of,
    gen,
    loader,
    own_val,
    rmse_on,
    seed,
    sine_series,
    val_acc,
    windows,
)


@case("functional_dropout_in_eval", "mechanics",
      bug="The forecaster applies F.dropout(h, 0.5) in forward without training=self.training, so dropout stays "
          "active under model.eval() and every validation / inference forecast is a noisy dropped-out sample.",
      cause_pattern=r"F\.dropout|functional dropout|training ?= ?self\.training|dropout.{0,80}(still|always|remains|"
                    r"stays|is) (active|on|applied|enabled)|dropout.{0,80}(eval|inference|validation)( mode)?|(eval|"
                    r"inference)\w*.{0,80}dropout|nn\.Dropout|(eval|inference)[- ]mode.{0,60}(non-?determinis|"
                    r"stochastic|random)|(non-?determinis|stochastic)\w*.{0,60}(eval|inference)[- ]mode")
def functional_dropout_in_eval(fixed: bool = False):
    seed(0)
    x, y = windows(sine_series(40, 150, s=51), 24, 1, stride=2)
    n = int(0.8 * len(x))

    class DropoutMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.out = nn.Linear(24, 128), nn.Linear(128, 128), nn.Linear(128, 1)

        def forward(self, x):
            kw = dict(training=self.training) if fixed else {}
            h = F.dropout(F.relu(self.fc1(x)), 0.5, **kw)
            h = F.dropout(F.relu(self.fc2(h)), 0.5, **kw)
            return self.out(h)

    model = DropoutMLP()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:n], y[:n]), 64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(x[n:], y[n:]), 256, shuffle=False), max_steps=300)


fix("functional_dropout_in_eval", fixed_of(functional_dropout_in_eval),
    rmse_on(own_val, lambda m, b: (m(b[0]), b[1])), "val RMSE (model.eval())", higher=False)


@case("count_forecast_rounded_in_forward", "mechanics",
      bug="The demand forecaster returns torch.round(self.head(h)) from forward to emit whole counts; round has zero "
          "gradient almost everywhere, so no weight ever receives a gradient and nothing is learned.",
      cause_pattern=r"\bround(ing|ed|s)?\b|(zero|no|null) gradients?.{0,60}(step|piecewise|quanti[sz])|(step|piecewise)"
                    r"[- ]constant|straight[- ]through|non-?differentiable")
def count_forecast_rounded_in_forward(fixed: bool = False):
    seed(0)
    s = sine_series(40, 150, s=52)
    counts = torch.clamp(12 + 6 * s, min=0).round()
    x, y = windows(counts, 28, 1, stride=2)
    n = int(0.8 * len(x))

    class DemandNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(28, 64), nn.ReLU())
            self.head = nn.Linear(64, 1)

        def forward(self, x):
            out = self.head(self.body(x / 20))
            return out if fixed else torch.round(out)       # orders come in whole units

    model = DemandNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:n], y[:n]), 64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(x[n:], y[n:]), 256, shuffle=False), max_steps=300)


fix("count_forecast_rounded_in_forward", fixed_of(count_forecast_rounded_in_forward),
    rmse_on(own_val, lambda m, b: (m(b[0]), b[1])), "val RMSE (counts)", higher=False)


@case("warmup_lambda_never_caps", "mechanics",
      bug="The LambdaLR warm-up factor lr_lambda = lambda step: (step + 1) / warmup has no min(1.0, ...), so after "
          "the 5 warm-up steps the learning rate keeps growing linearly, to 60x the base rate by step 300.",
      cause_pattern=r"lambdalr|lr_lambda|warm-?up.{0,80}(cap|clamp|min\(|never (stops|ends|levels|plateaus)|keeps? "
                    r"(rising|growing|increasing)|unbounded|grows|exceed)|(learning rate|\blr\b).{0,60}(keeps? (rising|"
                    r"growing|increasing)|grows (linearly|without)|\d+x (the )?(base|initial|peak)|times the (base|"
                    r"initial|peak))|min\(1(\.0)?,")
def warmup_lambda_never_caps(fixed: bool = False):
    seed(0)
    x, y = windows(sine_series(40, 150, s=53), 24, 4, stride=2)
    n = int(0.8 * len(x))
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    warmup = 5
    if fixed:
        lam = lambda step: min(1.0, (step + 1) / warmup)      # noqa: E731
    else:
        lam = lambda step: (step + 1) / warmup                # noqa: E731
    return dict(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lam),
                train_loader=loader(TensorDataset(x[:n], y[:n]), 64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(x[n:], y[n:]), 256, shuffle=False), max_steps=300)


fix("warmup_lambda_never_caps", fixed_of(warmup_lambda_never_caps),
    rmse_on(own_val, lambda m, b: (m(b[0]), b[1])), "val 4-step RMSE", higher=False)


def _marker_sequences(n, s, L=20):
    """ECG-like sequences: the beat type (class) shows only in the first 4 samples, then baseline noise."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.3 * torch.randn(n, L, 2, generator=g)
    x[:, :4, 0] += (y % 2).float()[:, None] * 2 - 1
    x[:, :4, 1] += (y // 2).float()[:, None] * 2 - 1
    return x, y


@case("rnn_cell_loop_detaches_each_step", "mechanics",
      bug="The hand-written GRUCell loop does h = h.detach() at every time step (added to silence 'backward through "
          "the graph a second time'), which truncates backprop-through-time to one step, so nothing learns to "
          "remember the beat at the start of the sequence.",
      cause_pattern=r"detach\w*.{0,80}(each|every|per|inside|within|in the) (time[- ]?)?(step|loop|iteration)|"
                    r"(truncat|cut)\w*.{0,60}(bptt|backprop\w*|gradient)|bptt|backprop\w* through time|h ?= ?h\.detach|"
                    r"(gradient|grad)s?.{0,60}(only|just) (one|1|a single) (time[- ]?)?step")
def rnn_cell_loop_detaches_each_step(fixed: bool = False):
    seed(0)
    x, y = _marker_sequences(1400, s=54)

    class BeatRNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = nn.GRUCell(2, 32)
            self.fc = nn.Linear(32, 4)

        def forward(self, x):                        # (B, T, 2)
            h = x.new_zeros(x.size(0), 32)
            for t in range(x.size(1)):
                h = self.cell(x[:, t], h)
                if not fixed:
                    h = h.detach()
            return self.fc(h)

    model = BeatRNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 64), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 200, shuffle=False), max_steps=300)


fix("rnn_cell_loop_detaches_each_step", fixed_of(rnn_cell_loop_detaches_each_step), val_acc, "val accuracy")


@case("ae_sigmoid_output_on_zscored", "mechanics",
      bug="The anomaly autoencoder ends in nn.Sigmoid (copied from an image AE) but reconstructs z-scored sensor "
          "windows, half of whose values are negative, so no reconstruction can go below 0.",
      cause_pattern=r"sigmoid.{0,80}(standardi[sz]|z-?scor|negative|below (0|zero))|(standardi[sz]|z-?scor|negative)"
                    r".{0,80}sigmoid|(output|reconstruction)s?.{0,60}(cannot|can't|can not|never|unable to) (go |be |"
                    r"become )?(below|reach|negative|represent)|(bounded|squash)\w*.{0,60}(output|activation).{0,60}"
                    r"(target|input|data|range)")
def ae_sigmoid_output_on_zscored(fixed: bool = False):
    seed(0)
    x = _sensor_windows(1500, s=55)
    x = (x - x[:1200].mean()) / x[:1200].std()
    model = WindowAE(out_act=None if fixed else nn.Sigmoid())
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1200], x[:1200]), 64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(x[1200:], x[1200:]), 300, shuffle=False), max_steps=300)


fix("ae_sigmoid_output_on_zscored", fixed_of(ae_sigmoid_output_on_zscored),
    rmse_on(own_val, lambda m, b: (m(b[0]), b[0])), "val reconstruction RMSE", higher=False)
