"""Family ``mechanics``: causal convolutions, normalisation inverses, packing, decoding loops, integration."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from benchmarks.blind_preflight_bj.models import Seq2Seq
from benchmarks.blind_preflight_bj.registry import (case, fix, fixed_of, gen, loaders, mae_of, mlp, seed, series,
                                                    time_split, val_mae, windows)

L, H = 32, 3


class CausalConv(nn.Module):
    def __init__(self, cin, cout, k, d, trim_end):
        super().__init__()
        self.pad = (k - 1) * d
        self.conv = nn.Conv1d(cin, cout, k, dilation=d, padding=self.pad)
        self.trim_end = trim_end

    def forward(self, x):
        y = self.conv(x)
        return y[..., :-self.pad] if self.trim_end else y[..., self.pad:]


class TCN(nn.Module):
    def __init__(self, trim_end=True):
        super().__init__()
        self.layers = nn.ModuleList([CausalConv(1 if i == 0 else 16, 16, 3, 2 ** i, trim_end) for i in range(3)])
        self.head = nn.Linear(16, H)

    def forward(self, x):
        z = x.unsqueeze(1)
        for layer in self.layers:
            z = torch.relu(layer(z))
        return self.head(z[..., -1])


@case("m_tcn_trim_wrong_side", "mechanics",
      "The causal convolution pads (k-1)*dilation on both sides and then drops the first pad outputs (y[..., pad:]) "
      "instead of the last ones (y[..., :-pad]), so every output looks forward instead of back: the last output, used "
      "for the forecast, sees the last input and zero padding, not the window before it.",
      r"\[\.\.\., ?:-?pad\]|\[\.\.\., ?pad:\]|(trim|chomp|crop|slice|drop|cut)\w*.{0,80}(wrong|start|left|beginning|"
      r"first|end|right).{0,40}(side|end|outputs|pad)|(causal).{0,80}(pad|trim|chomp|shift|align)\w*.{0,80}"
      r"(wrong|misalign|future|zero)|(last|final) (output|position|step).{0,80}(zero|padding|future|miss\w* the "
      r"(most )?recent)")
def m_tcn_trim_wrong_side(fixed=False):
    seed(30)
    tr, va = time_split(series(s=30))
    model = TCN(trim_end=fixed)
    tl, vl = loaders(windows(tr, L, H), windows(va, L, H))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


fix("m_tcn_trim_wrong_side", fixed_of(m_tcn_trim_wrong_side), val_mae, "val MAE", higher=False)


class RevIN(nn.Module):
    """Instance-normalised MLP forecaster: normalise the window, forecast, undo the normalisation."""

    def __init__(self, denorm):
        super().__init__()
        self.net = mlp(L, H)
        self.denorm = denorm

    def forward(self, x):
        mu, sd = x.mean(1, keepdim=True), x.std(1, keepdim=True) + 1e-3
        out = self.net((x - mu) / sd)
        return out * sd + mu if self.denorm else out


@case("m_revin_no_denorm", "mechanics",
      "The forecaster normalises each input window by its own mean and std but returns the normalised forecast "
      "without the inverse (out * std + mean), while the loss compares it with raw-scale targets, so the series' "
      "level and scale are lost.",
      r"(denormali|de-normali|un-?normali|inverse[- ]?(transform|normali|scal)|invert\w*|undo\w*|revers\w*|"
      r"rescal\w*).{0,80}(forecast|output|prediction|normali)|(out|pred\w*) ?\* ?(std|sd|sigma|scale) ?\+ ?(mean|mu)|"
      r"(normali[sz]ed|scaled) (space|scale|units).{0,80}(raw|original)|(raw|original)[- ](scale|units).{0,80}"
      r"normali[sz]ed")
def m_revin_no_denorm(fixed=False):
    seed(31)
    tr, va = time_split(series(s=31, level=10.0, spread=40.0, noise=0.3))
    model = RevIN(denorm=fixed)
    tl, vl = loaders(windows(tr, L, H, 2), windows(va, L, H))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


fix("m_revin_no_denorm", fixed_of(m_revin_no_denorm), val_mae, "val MAE (raw scale)", higher=False)


class PackedGRU(nn.Module):
    def __init__(self, true_lengths):
        super().__init__()
        self.gru = nn.GRU(1, 32, batch_first=True)
        self.head = nn.Linear(32, 1)
        self.true_lengths = true_lengths

    def forward(self, x, lengths):
        lengths = lengths if self.true_lengths else torch.full_like(lengths, x.shape[1])
        packed = pack_padded_sequence(x.unsqueeze(-1), lengths, batch_first=True, enforce_sorted=False)
        _, h = self.gru(packed)
        return self.head(h[-1]).squeeze(-1)


def var_length(s, n, fixed_lengths=False):
    g = gen(s)
    x = series(S=1, T=n + 80, s=s)[0]
    starts = torch.randint(0, n, (n,), generator=g)
    lens = torch.randint(6, L + 1, (n,), generator=g)
    X = torch.zeros(n, L)
    y = torch.zeros(n)
    for i, (a, k) in enumerate(zip(starts.tolist(), lens.tolist())):
        X[i, :k] = x[a:a + k]
        y[i] = x[a + k]
    return X, lens, y


def packed_loss(model, batch):
    x, lens, y = batch
    return ((model(x, lens) - y) ** 2).mean()


@case("m_pack_lengths_full", "mechanics",
      "pack_padded_sequence is given the padded length for every series instead of each series' true length, so the "
      "GRU's final hidden state is read after the trailing zero padding rather than at the last real observation.",
      r"length.{0,80}(true|actual|real|each|per[- ]sequence|per[- ]series)|(padded|max\w*|full) length|"
      r"(hidden|final|last) (state|output).{0,80}(padding|pad|zeros)|pad\w*.{0,60}(zero|value)s?.{0,60}"
      r"(consum|read|processed|run through)")
def m_pack_lengths_full(fixed=False):
    seed(32)
    tr = var_length(32, 1500)
    va = var_length(33, 400)
    model = PackedGRU(true_lengths=fixed)
    tl, vl = loaders(tr, va)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tl,
                loss_fn=packed_loss, val_loader=vl)


fix("m_pack_lengths_full", fixed_of(m_pack_lengths_full), mae_of(lambda m, b: (m(b[0], b[1]), b[2])), "val MAE",
    higher=False)


def free_running_loss(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


@case("m_decoder_no_hidden", "mechanics",
      "The autoregressive decoder loop calls self.dec(inp) without the hidden state, so every decoding step starts "
      "from a zero state: the encoder's summary of the window and the previous decoder state are never passed on.",
      r"hidden.{0,80}(not|never|isn'?t|without|drop|discard|reset|zero|lost).{0,60}(pass|carr|fed|forward|decod|step)|"
      r"(without|no|missing) (the )?(hidden|state|h\b|h0|encoder state)|(zero|fresh|reset|new) (hidden )?state.{0,40}"
      r"(each|every) (decod\w* )?step|encoder.{0,60}(state|summary|context).{0,60}(never|not|ignored|unused|discard)")
def m_decoder_no_hidden(fixed=False):
    seed(33)
    tr, va = time_split(series(s=33))
    model = Seq2Seq(6, carry_hidden=fixed)
    tl, vl = loaders(windows(tr, 24, 6), windows(va, 24, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tl,
                loss_fn=free_running_loss, val_loader=vl)


fix("m_decoder_no_hidden", fixed_of(m_decoder_no_hidden), val_mae, "val MAE (autoregressive)", higher=False)


class DeltaForecaster(nn.Module):
    """Predicts step-to-step changes and integrates them from the last observed value."""

    def __init__(self, dim):
        super().__init__()
        self.net = mlp(L, 6)
        self.dim = dim

    def forward(self, x):
        return x[:, -1:] + self.net(x - x[:, -1:]).cumsum(self.dim)


@case("m_cumsum_dim0", "mechanics",
      "The delta forecaster integrates its predicted step changes with cumsum(dim=0), across the batch, instead of "
      "cumsum(dim=1) along the horizon, so each sample's forecast adds up other samples' deltas.",
      r"cumsum|cumulative sum|(integrat|accumulat|sum)\w*.{0,60}(across|over|along) the (batch|sample)|"
      r"(batch|sample)s?.{0,40}(axis|dim\w*).{0,60}(instead of|rather than).{0,30}(horizon|time)")
def m_cumsum_dim0(fixed=False):
    seed(34)
    tr, va = time_split(series(s=34))
    model = DeltaForecaster(dim=1 if fixed else 0)
    tl, vl = loaders(windows(tr, L, 6), windows(va, L, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


fix("m_cumsum_dim0", fixed_of(m_cumsum_dim0), val_mae, "val MAE", higher=False)
