"""Set h, family 'shapes': shapes, broadcasting and axes at the model or the loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_h.registry import case, fix, gen, loader, seed, val_acc

# --------------------------------------------------------------------------------------------------------------
# S1: a unidirectional GRU read at out[:, 0] (the [CLS] habit)


def ticket_tokens(n, s):
    g = gen(s)
    x = torch.randint(1, 16, (n, 12), generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    pos = torch.randint(3, 12, (n,), generator=g)
    x[torch.arange(n), pos] = 16 + y          # the routing keyword, somewhere after the greeting
    return x, y


class TicketGRU(nn.Module):
    def __init__(self, read_first=True):
        super().__init__()
        self.emb = nn.Embedding(20, 16)
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.head = nn.Linear(32, 4)
        self.read_first = read_first

    def forward(self, x):
        out, _ = self.gru(self.emb(x))
        return self.head(out[:, 0] if self.read_first else out[:, -1])


def _ticket(read_first=True):
    seed(0)
    x, y = ticket_tokens(1024, 1)
    vx, vy = ticket_tokens(256, 2)
    model = TicketGRU(read_first)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@case("ticket_router_gru_reads_first_step_as_cls", "shapes",
      bug="the unidirectional GRU's classifier reads out[:, 0] (the [CLS] position habit from BERT code): for a "
          "left-to-right GRU that is the state after the first token only, so the routing keyword later in the "
          "ticket never reaches the head; the last step out[:, -1] (or h_n) has read the whole ticket",
      cause_pattern=(r"out\[\s*:\s*,\s*0\s*\]|\[CLS\]|first (time ?step|token|position)('s)? (hidden )?(state|output)|"
                    r"state after the first|output at position 0|h_n|last (time ?step|hidden state|output step)|"
                    r"out\[\s*:\s*,\s*-1\s*\]|(unidirectional|left-to-right|forward-only).{0,60}(read|pool|first|state)"))
def ticket_router_gru_reads_first_step_as_cls():
    return _ticket(True)


def _gru_fact():
    gru = nn.GRU(2, 3, batch_first=True)
    a, b = torch.randn(1, 5, 2), torch.randn(1, 5, 2)
    b[:, 0] = a[:, 0]
    print("  fact: two sequences sharing only their first step give the same out[:, 0]:",
          torch.allclose(gru(a)[0][:, 0], gru(b)[0][:, 0]))


fix("ticket_router_gru_reads_first_step_as_cls", lambda: _ticket(False), val_acc, "val accuracy", fact=_gru_fact)

# --------------------------------------------------------------------------------------------------------------
# S2: torch.fft.rfft on (B, T, 3) windows, default dim=-1 = the axis channel


def vibration(n, s):
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    freq = torch.tensor([5.0, 6.0, 7.0, 8.0])[y]
    t = torch.arange(64) / 64
    phase = torch.rand(n, 1, 3, generator=g) * 6.283
    amp = 0.5 + torch.rand(n, 1, 3, generator=g)
    x = amp * torch.sin(6.283 * freq[:, None, None] * t[None, :, None] + phase)
    return x + 0.8 * torch.randn(n, 64, 3, generator=g), y


class SpectrumMLP(nn.Module):
    def __init__(self, over_time=False):
        super().__init__()
        self.over_time = over_time
        n_in = 33 * 3 if over_time else 64 * 2
        self.net = nn.Sequential(nn.Linear(n_in, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):                                # x: (B, T=64, axes=3)
        spec = torch.fft.rfft(x, dim=1) if self.over_time else torch.fft.rfft(x)
        return self.net(spec.abs().flatten(1))


def _vibration(over_time=False):
    seed(0)
    x, y = vibration(1024, 3)
    vx, vy = vibration(256, 4)
    model = SpectrumMLP(over_time)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@case("bearing_vibration_rfft_taken_over_axis_channels", "shapes",
      bug="the spectral features are torch.fft.rfft(x).abs() on (B, T, 3) accelerometer windows: rfft's default "
          "dim=-1 is the 3-axis channel dimension, so it transforms across x/y/z at each time step instead of "
          "along the 64 time samples (dim=1), and the fault frequency never shows up as a spectral peak",
      cause_pattern=r"rfft|\bfft\b|fourier|spectr\w*.{0,60}(axis|dim|channel)|(axis|channel)s? (dim|dimension).{0,40}"
                    r"(instead of|not) (the )?time|dim=1\b.{0,40}time|over the (3 )?(axis|channel)")
def bearing_vibration_rfft_taken_over_axis_channels():
    return _vibration(False)


fix("bearing_vibration_rfft_taken_over_axis_channels", lambda: _vibration(True), val_acc, "val accuracy",
    fact=lambda: print("  fact: torch.fft.rfft((8, 64, 3)).shape =", tuple(torch.fft.rfft(torch.randn(8, 64, 3)).shape)))

# --------------------------------------------------------------------------------------------------------------
# S3: SupCon positive mask from labels == labels.T on a 1-D label vector


def speakers(n, s):
    g = gen(s)
    protos = torch.randn(8, 20, generator=gen(77))
    y = torch.randint(0, 8, (n,), generator=g)
    return protos[y] + 1.2 * torch.randn(n, 20, generator=g), y


def supcon(outer: bool, tau: float = 0.2):
    def loss_fn(model, batch):
        x, labels = batch
        z = F.normalize(model(x), dim=1)
        sim = z @ z.T / tau
        eye = torch.eye(len(x), dtype=torch.bool)
        sim = sim.masked_fill(eye, -1e9)
        log_prob = sim - torch.logsumexp(sim, dim=1, keepdim=True)
        pos = (labels[:, None] == labels[None, :]) if outer else (labels == labels.T)
        pos = pos.float() * (~eye).float()
        return -((pos * log_prob).sum(1) / pos.sum(1).clamp(min=1)).mean()
    return loss_fn


def _speaker(outer=False):
    seed(0)
    x, y = speakers(1024, 5)
    vx, vy = speakers(256, 6)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 16))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, y), 64, drop_last=True),
                val_loader=loader(TensorDataset(vx, vy), 64, shuffle=False), loss_fn=supcon(outer), max_steps=300)


@torch.no_grad()
def cluster_margin(model, kw):
    """Mean cosine similarity to same-speaker embeddings minus to other speakers' (validation clips)."""
    x, y = speakers(256, 6)
    z = F.normalize(model(x), dim=1)
    sim = z @ z.T
    same = (y[:, None] == y[None, :]) & ~torch.eye(len(y), dtype=torch.bool)
    return (sim[same].mean() - sim[~same & ~torch.eye(len(y), dtype=torch.bool)].mean()).item()


@case("speaker_supcon_positive_mask_from_1d_transpose", "shapes",
      bug="the supervised-contrastive positive mask is labels == labels.T with a 1-D (B,) label vector: .T is a "
          "no-op on 1-D tensors, so the comparison is elementwise and all True, and broadcast against the (B, B) "
          "similarities it marks every pair as a positive: all speakers are pulled together; the mask needs "
          "labels[:, None] == labels[None, :]",
      cause_pattern=(r"labels\.T|\.T (is a no-op|on a 1-?d)|no-op on 1-?d|1-?d (label|tensor|vector)|labels\[:, ?None\]|"
                    r"outer (comparison|equality)|(every|all) pairs?.{0,40}positive|positive mask|pos(itive)?_mask"))
def speaker_supcon_positive_mask_from_1d_transpose():
    return _speaker(False)


fix("speaker_supcon_positive_mask_from_1d_transpose", lambda: _speaker(True), cluster_margin,
    "same-minus-other cosine margin",
    fact=lambda: print("  fact: (labels == labels.T) for labels=[0,1,2] ->", (torch.tensor([0, 1, 2]) ==
                                                                             torch.tensor([0, 1, 2]).T).tolist()))

# --------------------------------------------------------------------------------------------------------------
# S4: NT-Xent with views stacked interleaved but labels for the concatenated layout


def tabular_rows(n, s):
    g = gen(s)
    basis = torch.randn(6, 16, generator=gen(91))
    return torch.randn(n, 6, generator=g) @ basis + 0.3 * torch.randn(n, 16, generator=g)


def augment(x):
    keep = (torch.rand_like(x) > 0.3).float()
    return x * keep + 0.3 * torch.randn_like(x)


def ntxent(interleaved: bool, tau: float = 0.2):
    def loss_fn(model, batch):
        x = batch[0]
        b = len(x)
        z1, z2 = model(augment(x)), model(augment(x))
        z = torch.stack([z1, z2], dim=1).reshape(2 * b, -1) if interleaved else torch.cat([z1, z2])
        z = F.normalize(z, dim=1)
        sim = (z @ z.T / tau).masked_fill(torch.eye(2 * b, dtype=torch.bool), -1e9)
        labels = (torch.arange(2 * b) + b) % (2 * b)
        return F.cross_entropy(sim, labels)
    return loss_fn


def _ntxent(interleaved=True):
    seed(0)
    x = tabular_rows(2048, 8)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x), 64, drop_last=True), loss_fn=ntxent(interleaved), max_steps=300)


@torch.no_grad()
def view_retrieval(model, kw):
    """Validation rows: how often a row's second augmented view is the nearest to its first view (of 256)."""
    torch.manual_seed(123)
    x = tabular_rows(256, 9)
    z1, z2 = F.normalize(model(augment(x)), dim=1), F.normalize(model(augment(x)), dim=1)
    return ((z1 @ z2.T).argmax(1) == torch.arange(256)).float().mean().item()


@case("tabular_ntxent_views_stacked_interleaved", "shapes",
      bug="the two views' embeddings are combined with torch.stack([z1, z2], dim=1).reshape(2B, -1), which "
          "interleaves them (row 2i is view 1 of sample i, row 2i+1 view 2), while the NT-Xent labels "
          "(arange(2B) + B) % 2B assume the torch.cat([z1, z2]) block layout: the 'positive' of each row is an "
          "unrelated sample, so the loss pulls random rows together",
      cause_pattern=r"interleav|torch\.stack|stack\(|torch\.cat|block layout|\(arange\(2B?\) ?\+ ?B\)|"
                    r"positive (pair|index|indices|label)s?.{0,60}(wrong|unrelated|mismatch|another|different)|"
                    r"(view|pair)s? (order|layout)")
def tabular_ntxent_views_stacked_interleaved():
    return _ntxent(True)


fix("tabular_ntxent_views_stacked_interleaved", lambda: _ntxent(False), view_retrieval, "view retrieval top-1",
    fact=lambda: print("  fact: stack([a, b], 1).reshape(4, -1) rows for a=[0,1], b=[10,11]:",
                       torch.stack([torch.tensor([[0.], [1.]]), torch.tensor([[10.], [11.]])], 1)
                       .reshape(4, -1).flatten().tolist()))

# --------------------------------------------------------------------------------------------------------------
# S5: soft-argmax grids from torch.meshgrid in numpy's argument order


def blobs(n, s):
    g = gen(s)
    rc = torch.randint(2, 14, (n, 2), generator=g).float()
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    img = torch.exp(-((yy - rc[:, 0, None, None]) ** 2 + (xx - rc[:, 1, None, None]) ** 2) / 3.0)
    img = img + 0.05 * torch.randn(n, 16, 16, generator=g)
    target = torch.stack([rc[:, 1], rc[:, 0]], 1) / 7.5 - 1          # (x, y) in [-1, 1]
    return img[:, None], target


class SoftArgmaxNet(nn.Module):
    def __init__(self, numpy_order=True):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(8, 1, 3, padding=1))
        lin = torch.linspace(-1, 1, 16)
        if numpy_order:
            gx, gy = torch.meshgrid(lin, lin)          # np.meshgrid(xs, ys) habit; torch's default is 'ij'
        else:
            gy, gx = torch.meshgrid(lin, lin, indexing="ij")
        self.register_buffer("gx", gx.reshape(-1))
        self.register_buffer("gy", gy.reshape(-1))

    def forward(self, img):
        p = self.net(img).flatten(1).softmax(-1)
        return torch.stack([p @ self.gx, p @ self.gy], 1)


def _blob(numpy_order=True):
    seed(0)
    x, t = blobs(1024, 10)
    vx, vt = blobs(256, 11)
    model = SoftArgmaxNet(numpy_order)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, t), 32), val_loader=loader(TensorDataset(vx, vt), 64, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


@torch.no_grad()
def pixel_error(model, kw):
    x, t = blobs(256, 11)
    return ((model(x) - t) * 7.5).norm(dim=1).mean().item()


@case("blob_softargmax_meshgrid_in_numpy_order", "shapes",
      bug="the soft-argmax coordinate grids come from gx, gy = torch.meshgrid(xs, ys), written in np.meshgrid's "
          "argument order, but torch.meshgrid defaults to indexing='ij': gx varies along the rows, so the 'x' "
          "output is the expected row and 'y' the expected column; the (x, y) targets are transposed relative to "
          "what the heatmap can express",
      cause_pattern=r"meshgrid|indexing ?= ?['\"]?(ij|xy)|soft-?argmax.{0,60}(grid|swap|transpos)|"
                    r"(x|y|coordinate)s? (and|/) ?(y|x)?.{0,20}swap|swapped (x|y|coordinates)|transposed (grid|coordinates)")
def blob_softargmax_meshgrid_in_numpy_order():
    return _blob(True)


fix("blob_softargmax_meshgrid_in_numpy_order", lambda: _blob(False), pixel_error, "val keypoint error (px)",
    higher=False, fact=lambda: print("  fact: gx, gy = torch.meshgrid(xs, ys): gx[:, 0] =",
                                     torch.meshgrid(torch.arange(3.), torch.arange(3.), indexing="ij")[0][:, 0].tolist(),
                                     "(varies along rows)"))

# --------------------------------------------------------------------------------------------------------------
# S6: learned position embedding looked up with the token ids


def playlists(n, s):
    g = gen(s)
    x = torch.stack([torch.randperm(20, generator=g)[:8] for _ in range(n)])
    return x, (x[:, 0] < x[:, -1]).long()


class OrderTransformer(nn.Module):
    def __init__(self, index_by_tokens=True):
        super().__init__()
        self.tok = nn.Embedding(20, 32)
        self.pos = nn.Embedding(32, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(32, 2)
        self.index_by_tokens = index_by_tokens

    def forward(self, x):
        positions = x if self.index_by_tokens else torch.arange(x.size(1), device=x.device)
        return self.head(self.enc(self.tok(x) + self.pos(positions)).mean(1))


def _playlist(index_by_tokens=True):
    seed(0)
    x, y = playlists(2048, 12)
    vx, vy = playlists(256, 13)
    model = OrderTransformer(index_by_tokens)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@case("playlist_order_transformer_positions_indexed_by_token_ids", "shapes",
      bug="the learned position embedding is looked up with the token ids, self.pos(x), instead of the positions "
          "torch.arange(T): it is a second token embedding, the mean-pooled encoder is then blind to order, and the "
          "label (is the first track's id below the last one's) depends only on order",
      cause_pattern=(r"position(al)?[ _-]?(embedding|ids|index|indices).{0,80}(token|input)[ _-]?ids?|"
                    r"self\.pos\(x\)|arange\(\s*T|no (order|position)(al)? (information|signal)|"
                    r"order[- ]?(blind|invariant)|permutation[- ]invariant"))
def playlist_order_transformer_positions_indexed_by_token_ids():
    return _playlist(True)


fix("playlist_order_transformer_positions_indexed_by_token_ids", lambda: _playlist(False), val_acc, "val accuracy")
