"""Set i, shapes: shapes, broadcasting and axes at the model or the loss (6 broken cases)."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_i.registry import accuracy, case, fix, gen, loader, seed, val_acc

# --------------------------------------------------------------------------------------------------------------------
# 1. NCF recommender: torch.cat((u, v)) concatenates along dim 0 (the default), then .view(-1, 2 * dim) "fixes" the
#    shape: each row of the MLP input holds two users (first half of the batch) or two items (second half).
# --------------------------------------------------------------------------------------------------------------------
N_USERS, N_ITEMS, N_GENRES = 120, 150, 4


def _interactions(n: int, s: int):
    g = gen(100)  # the same users and items for every split
    taste = torch.randn(N_USERS, N_GENRES, generator=g)
    genre = torch.randint(0, N_GENRES, (N_ITEMS,), generator=g)
    quality = 0.5 * torch.randn(N_ITEMS, generator=g)
    g = gen(s)
    users = torch.randint(0, N_USERS, (n,), generator=g)
    items = torch.randint(0, N_ITEMS, (n,), generator=g)
    liked = ((taste[users, genre[items]] + quality[items]) > 0).float()
    return users, items, liked


class NeuralCF(nn.Module):
    """The MLP tower of NCF (He et al. 2017): user and item embeddings concatenated into an MLP."""

    def __init__(self, dim: int = 16, concat_dim: int | None = None):
        super().__init__()
        self.dim, self.concat_dim = dim, concat_dim
        self.user = nn.Embedding(N_USERS, dim)
        self.item = nn.Embedding(N_ITEMS, dim)
        self.mlp = nn.Sequential(nn.Linear(2 * dim, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, users, items):
        u, v = self.user(users), self.item(items)
        if self.concat_dim is None:
            x = torch.cat((u, v)).view(-1, 2 * self.dim)   # (2B, dim) -> (B, 2*dim)
        else:
            x = torch.cat((u, v), dim=self.concat_dim)
        return self.mlp(x).squeeze(-1)


def ncf_bce(model, batch):
    users, items, liked = batch
    return F.binary_cross_entropy_with_logits(model(users, items), liked)


@torch.no_grad()
def ncf_val_acc(model, kw):
    model.eval()
    users, items, liked = _interactions(1500, 2)
    acc = ((model(users, items) > 0).float() == liked).float().mean().item()
    model.train()
    return acc


@case("movielens_ncf_cat_default_dim_then_view", "shapes",
      bug="the NCF MLP tower joins the user and item embeddings with torch.cat((u, v)), whose default dim=0 stacks "
          "them along the batch into (2B, dim), and .view(-1, 2 * dim) then makes the shape fit: the first half of "
          "the rows holds two users' embeddings, the second half two items', none a user with its own item "
          "(torch.cat((u, v), dim=1) was meant)",
      cause_pattern=r"torch\.cat|\bcat\(|concat\w*[^.]*(dim|axis)|(cat|concat|stack)\w*[^.]*(dim\s*=?\s*0|"
                    r"along the batch|batch (dim|axis))|(user|item)[^.]*(embedding|vector)s?[^.]*(mix|mismatch|"
                    r"wrong rows?|other (users?|items?)|pair)|(rows?|samples?)[^.]*(mixed|interleaved|"
                    r"scrambled) across the batch|(mix|mixes|mixing)[^.]*(samples|rows|examples) (of|across|"
                    r"within) the batch")
def movielens_ncf_cat_default_dim_then_view(concat_dim=None):
    seed(0)
    train = TensorDataset(*_interactions(6000, 1))
    val = TensorDataset(*_interactions(1500, 2))
    model = NeuralCF(concat_dim=concat_dim)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(train, 64), val_loader=loader(val, 256, shuffle=False), loss_fn=ncf_bce)


def _ncf_fact():
    u, v = torch.zeros(4, 16), torch.ones(4, 16)
    rows = torch.cat((u, v)).view(-1, 32)
    print(f"  torch.cat of two (4, 16) tensors: {tuple(torch.cat((u, v)).shape)}; .view(-1, 32) rows hold "
          f"user parts {[int((r[:16] == 0).all()) for r in rows]} (1: a user embedding in the user slot)")


fix("movielens_ncf_cat_default_dim_then_view", partial(movielens_ncf_cat_default_dim_then_view, concat_dim=1),
    ncf_val_acc, "val accuracy", _ncf_fact, steps=600)


# --------------------------------------------------------------------------------------------------------------------
# 2. GCN on small graphs: the dense adjacency is filled with A[edge_index] = 1, which indexes the ROWS named by both
#    the source and the destination ids: every node that has an edge gets a full row of ones.
# --------------------------------------------------------------------------------------------------------------------
GN, GCOL = 10, 3


class NeighbourColourGraphs(Dataset):
    """Each graph: 10 nodes with a colour (one-hot) and noise features; a node's label is the majority colour of
    its neighbours (ties -> the lowest colour id). Edges stored as edge_index (2, E), both directions."""

    def __init__(self, n: int, s: int, index_pairs: bool):
        g = gen(s)
        self.index_pairs = index_pairs
        self.items = []
        for _ in range(n):
            colour = torch.randint(0, GCOL, (GN,), generator=g)
            src, dst = [], []
            perm = torch.randperm(GN, generator=g)
            for k in range(1, GN):  # a random tree keeps every node connected
                j = perm[torch.randint(0, k, (1,), generator=g)].item()
                src.append(perm[k].item())
                dst.append(j)
            for _ in range(4):
                a, b = torch.randint(0, GN, (2,), generator=g).tolist()
                if a != b:
                    src.append(a)
                    dst.append(b)
            ei = torch.tensor([src + dst, dst + src])
            x = torch.cat([F.one_hot(colour, GCOL).float(), 0.5 * torch.randn(GN, 5, generator=g)], 1)
            adj = torch.zeros(GN, GN)
            adj[ei[0], ei[1]] = 1
            counts = adj @ F.one_hot(colour, GCOL).float()
            self.items.append((x, ei, counts.argmax(1)))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        x, edge_index, y = self.items[i]
        A = torch.zeros(GN, GN)
        if self.index_pairs:
            A[edge_index[0], edge_index[1]] = 1
        else:
            A[edge_index] = 1
        return x, A, y


class DenseGCN(nn.Module):
    def __init__(self, f: int = 8, h: int = 32, c: int = GCOL):
        super().__init__()
        self.self1, self.nb1 = nn.Linear(f, h), nn.Linear(f, h)
        self.self2, self.nb2 = nn.Linear(h, h), nn.Linear(h, h)
        self.out = nn.Linear(h, c)

    def forward(self, x, A):
        deg = A.sum(-1, keepdim=True).clamp(min=1)
        h = F.relu(self.self1(x) + self.nb1(A @ x / deg))
        h = F.relu(self.self2(h) + self.nb2(A @ h / deg))
        return self.out(h)


def node_ce(model, batch):
    x, A, y = batch
    return F.cross_entropy(model(x, A).reshape(-1, GCOL), y.reshape(-1))


def gcn_val_acc(model, kw):
    return accuracy(model, kw["val_loader"], fwd=lambda m, b: (m(b[0], b[1]).argmax(-1), b[2]))


@case("citation_gcn_adjacency_filled_with_edge_index_tensor", "shapes",
      bug="the dense adjacency is filled with A[edge_index] = 1: indexing with the (2, E) edge_index tensor selects "
          "whole ROWS of A for every id in it, so every node that has an edge gets a full row of ones and each "
          "node aggregates the whole graph instead of its neighbours (A[edge_index[0], edge_index[1]] = 1 was "
          "meant)",
      cause_pattern=r"edge_index|adjacen|A\[|advanced index|fancy index|(whole|entire|full) rows?|rows? of ones|"
                    r"(all|every) (node|neighbou?r)s?[^.]*(connected|neighbou?rs|aggregat)|complete graph|(dense|"
                    r"all).ones|neighbou?rhood")
def citation_gcn_adjacency_filled_with_edge_index_tensor(index_pairs=False):
    seed(0)
    train = NeighbourColourGraphs(600, 1, index_pairs)
    val = NeighbourColourGraphs(200, 2, index_pairs)
    model = DenseGCN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 100, shuffle=False), loss_fn=node_ce)


def _gcn_fact():
    ei = torch.tensor([[0, 1], [1, 2]])
    A = torch.zeros(4, 4)
    A[ei] = 1
    print(f"  edges 0->1, 1->2 on 4 nodes: A[edge_index] = 1 gives row sums {A.sum(1).tolist()} "
          f"(A[src, dst] would give [1, 1, 0, 0])")


fix("citation_gcn_adjacency_filled_with_edge_index_tensor",
    partial(citation_gcn_adjacency_filled_with_edge_index_tensor, index_pairs=True), gcn_val_acc,
    "val node accuracy", _gcn_fact)


# --------------------------------------------------------------------------------------------------------------------
# 3. TCN without the Chomp1d: Conv1d(padding=(k-1)*d) pads BOTH ends, the output grows by (k-1)*d per layer, and the
#    head reads out[:, :, -1], a position whose receptive field holds only the last input step (plus zero padding).
# --------------------------------------------------------------------------------------------------------------------
TCN_T = 48


def _fault_windows(n: int, s: int):
    g = gen(s)
    x = 0.3 * torch.randn(n, 3, TCN_T, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    start = torch.randint(0, TCN_T - 12, (n,), generator=g)
    burst = 2.0 * torch.sin(torch.arange(6) * math.pi / 3 + math.pi / 6)
    for i in range(n):
        x[i, y[i], start[i]:start[i] + 6] += burst
    return x, y


class Chomp1d(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.size = size

    def forward(self, x):
        return x[:, :, :-self.size]


class TCN(nn.Module):
    def __init__(self, chomp: bool, channels: int = 16, k: int = 3):
        super().__init__()
        layers, c_in = [], 3
        for d in (1, 2, 4, 8, 16):
            layers += [nn.Conv1d(c_in, channels, k, dilation=d, padding=(k - 1) * d)]
            if chomp:
                layers += [Chomp1d((k - 1) * d)]
            layers += [nn.ReLU()]
            c_in = channels
        self.net = nn.Sequential(*layers)
        self.head = nn.Linear(channels, 3)

    def forward(self, x):
        return self.head(self.net(x)[:, :, -1])


@case("machine_fault_tcn_padding_without_chomp_reads_last_step", "shapes",
      bug="the causal TCN's Conv1d layers use padding=(k-1)*dilation without the Chomp1d that trims it: Conv1d pads "
          "both ends, so every layer's output is longer than its input and the head's out[:, :, -1] reads a "
          "position whose receptive field holds only the last input time step (plus zero padding); the fault burst "
          "earlier in the window never reaches the head",
      cause_pattern=r"chomp|causal (conv|padding|tcn)|receptive field|(pad|padding)[^.]*(both (ends|sides)|trim|"
                    r"remov|future|longer|grow)|(output|sequence)[^.]*longer than[^.]*input|"
                    r"last (time )?step[^.]*(only|pad|zero)|only[^.]*last (time )?step|\[:, ?:, ?-1\]")
def machine_fault_tcn_padding_without_chomp_reads_last_step(chomp=False):
    seed(0)
    train = TensorDataset(*_fault_windows(1200, 1))
    val = TensorDataset(*_fault_windows(400, 2))
    model = TCN(chomp)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


def _tcn_fact():
    m = TCN(chomp=False)
    x = torch.randn(1, 3, TCN_T, requires_grad=True)
    out = m.net(x)
    out[0, :, -1].sum().backward()
    seen = (x.grad.abs().sum(1)[0] > 0).nonzero().flatten().tolist()
    print(f"  without the chomp: output length {out.shape[-1]} for input {TCN_T}; out[..., -1] depends on input "
          f"steps {seen}")


fix("machine_fault_tcn_padding_without_chomp_reads_last_step",
    partial(machine_fault_tcn_padding_without_chomp_reads_last_step, chomp=True), val_acc, "val accuracy", _tcn_fact)


# --------------------------------------------------------------------------------------------------------------------
# 4. CRNN on spectrograms computed as (frames, bins) while the model was written for torchaudio's (freq, time):
#    the CRNN averages away its "frequency" axis (really time) and runs its GRU along its "time" axis (really freq).
# --------------------------------------------------------------------------------------------------------------------
SR, NFFT, HOP, CLIP = 4000, 64, 32, 2048


def _beep_spectrograms(n: int, s: int):
    """Two beeps at one random pitch: short-long (class 0) or long-short (class 1); same total duration."""
    g = gen(s)
    t = torch.arange(CLIP) / SR
    specs, labels = [], []
    window = torch.hann_window(NFFT)
    for _ in range(n):
        y = int(torch.randint(0, 2, (1,), generator=g))
        pitch = 300 + 1200 * torch.rand(1, generator=g).item()
        short, long_, gap = 200, 600, int(torch.randint(150, 350, (1,), generator=g))
        first, second = (short, long_) if y == 0 else (long_, short)
        start = int(torch.randint(50, CLIP - (first + gap + second) - 50, (1,), generator=g))
        env = torch.zeros(CLIP)
        env[start:start + first] = 1
        env[start + first + gap:start + first + gap + second] = 1
        wav = env * torch.sin(2 * math.pi * pitch * t) + 0.05 * torch.randn(CLIP, generator=g)
        frames = wav.unfold(-1, NFFT, HOP) * window              # (n_frames, NFFT)
        spec = torch.log(torch.fft.rfft(frames).abs() ** 2 + 1e-2)  # (n_frames, n_bins)
        specs.append(spec)
        labels.append(y)
    specs = torch.stack(specs)
    return (specs - specs.mean()) / specs.std(), torch.tensor(labels)


class CRNN(nn.Module):
    """Conv blocks pooling frequency only, frequency averaged out, a GRU along time. Expects (B, n_freq, time)."""

    def __init__(self, transpose_input: bool):
        super().__init__()
        self.transpose_input = transpose_input
        self.conv = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d((2, 1)),
            nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d((2, 1)))
        self.pool = nn.AdaptiveAvgPool2d((1, None))
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, spec):
        if self.transpose_input:
            spec = spec.transpose(1, 2)
        x = spec.unsqueeze(1)                            # (B, 1, n_freq, time), as torchaudio's Spectrogram gives
        h = self.pool(self.conv(x)).squeeze(2)           # (B, 16, time)
        _, h_n = self.gru(h.transpose(1, 2))
        return self.head(h_n[-1])


@case("morse_beeps_crnn_spectrogram_time_and_frequency_swapped", "shapes",
      bug="the spectrograms are built as (frames, bins) with unfold + rfft, but the CRNN was written for "
          "torchaudio's (n_freq, time) layout and gets them untransposed: it averages away what it takes for the "
          "frequency axis (really time) and runs its GRU along frequency, so the order of the short and the long "
          "beep, the whole label, is pooled away (spec.transpose(1, 2) was needed)",
      cause_pattern=r"(time|frames?)[^.]*(and|vs\.?|versus|/|with)[^.]*freq|freq\w*[^.]*(and|vs\.?|versus|/|"
                    r"with)[^.]*(time|frames?)|transpos\w*[^.]*(spectrogram|time|freq|frames?|bins?)|(spectrogram|"
                    r"freq\w*|frames?|bins?)[^.]*transpos|n_freq|\(frames?, ?bins?\)|\(n_freq, ?time\)|"
                    r"pool\w*[^.]*over (the )?time|spectrogram[^.]*(layout|axes|axis|orientation)")
def morse_beeps_crnn_spectrogram_time_and_frequency_swapped(transpose_input=False):
    seed(0)
    train = TensorDataset(*_beep_spectrograms(640, 1))
    val = TensorDataset(*_beep_spectrograms(200, 2))
    model = CRNN(transpose_input)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


def _crnn_fact():
    spec, _ = _beep_spectrograms(1, 5)
    print(f"  one spectrogram: {tuple(spec.shape[1:])} = (frames, bins); the CRNN pools dim 1 of it away "
          f"(its 'frequency')")


fix("morse_beeps_crnn_spectrogram_time_and_frequency_swapped",
    partial(morse_beeps_crnn_spectrogram_time_and_frequency_swapped, transpose_input=True), val_acc,
    "val accuracy", _crnn_fact)


# --------------------------------------------------------------------------------------------------------------------
# 5. Set classifier with attention pooling by a learned seed query: nn.MultiheadAttention(query, key, value) is
#    called as pool(h, seed, seed): the elements query the single seed key, softmax over one key is 1, and every
#    output row is the projected seed: the pooled vector is the same for every set.
# --------------------------------------------------------------------------------------------------------------------
SET_N, SET_D = 12, 6


def _sets(n: int, s: int):
    g = gen(200)
    w = torch.randn(SET_D, 4, generator=g)
    g = gen(s)
    x = torch.randn(n, SET_N, SET_D, generator=g)
    y = F.relu(x @ w).mean(1).argmax(-1)
    return x, y


class SeedPooling(nn.Module):
    """Deep Sets phi, then pooling by multi-head attention from a learned seed (Set Transformer's PMA, k=1)."""

    def __init__(self, seed_queries: bool, d: int = 32):
        super().__init__()
        self.seed_queries = seed_queries
        self.phi = nn.Sequential(nn.Linear(SET_D, d), nn.ReLU(), nn.Linear(d, d))
        self.seed = nn.Parameter(torch.randn(1, 1, d) * 0.1)
        self.pool = nn.MultiheadAttention(d, 4, batch_first=True)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(d, 4))

    def forward(self, x):
        h = self.phi(x)
        s = self.seed.expand(x.shape[0], -1, -1)
        if self.seed_queries:
            z, _ = self.pool(s, h, h)
        else:
            z, _ = self.pool(h, s, s)
        return self.head(z[:, 0])


@case("pointset_attention_pooling_query_and_keys_swapped", "shapes",
      bug="the attention pooling calls nn.MultiheadAttention as pool(h, seed, seed): the set elements are the "
          "queries and the learned seed is the only key and value, so the softmax over one key is 1 and every "
          "output row is the projected seed: the pooled vector z[:, 0] is identical for every set and the head "
          "can only learn the class prior (pool(seed, h, h) was meant)",
      cause_pattern=r"MultiheadAttention|(query|queries)[^.]*(key|value|swap|order|argument)|(swap|"
                    r"order)[^.]*(query|queries|argument)|seed|single key|one key|attention[^.]*(constant|"
                    r"identical|same|independent of)|pool\w*[^.]*(identical|same|constant) (for|across) (every|"
                    r"all|each)")
def pointset_attention_pooling_query_and_keys_swapped(seed_queries=False):
    seed(0)
    train = TensorDataset(*_sets(1500, 1))
    val = TensorDataset(*_sets(400, 2))
    model = SeedPooling(seed_queries)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


def _pma_fact():
    torch.manual_seed(0)
    m = SeedPooling(seed_queries=False)
    x = torch.randn(3, SET_N, SET_D)
    with torch.no_grad():
        h = m.phi(x)
        z, _ = m.pool(h, m.seed.expand(3, -1, -1), m.seed.expand(3, -1, -1))
    print(f"  pool(h, seed, seed): spread of z[:, 0] across 3 different sets {z[:, 0].std(0).max().item():.2e}")


fix("pointset_attention_pooling_query_and_keys_swapped",
    partial(pointset_attention_pooling_query_and_keys_swapped, seed_queries=True), val_acc, "val accuracy",
    _pma_fact)


# --------------------------------------------------------------------------------------------------------------------
# 6. TextCNN with max-over-time pooling written as F.max_pool1d(h, h.size(1)): size(1) is the 32 channels, not the
#    58 positions; with stride = kernel = 32 the pooling keeps one window (positions 0-31) and drops the rest.
# --------------------------------------------------------------------------------------------------------------------
TXT_T, TXT_V = 60, 50


def _reviews(n: int, s: int):
    g = gen(s)
    ids = torch.randint(8, TXT_V, (n, TXT_T), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    pos = torch.randint(0, TXT_T, (n,), generator=g)
    word = torch.randint(0, 3, (n,), generator=g) + 2 + 3 * y       # 2-4 positive, 5-7 negative
    ids[torch.arange(n), pos] = word
    return ids, y


class TextCNN(nn.Module):
    def __init__(self, pool_dim: int = 1):
        super().__init__()
        self.pool_dim = pool_dim
        self.emb = nn.Embedding(TXT_V, 16)
        self.conv = nn.Conv1d(16, 32, 3)
        self.fc = nn.Linear(32, 2)

    def forward(self, ids):
        h = F.relu(self.conv(self.emb(ids).transpose(1, 2)))      # (B, 32, T - 2)
        h = F.max_pool1d(h, h.size(self.pool_dim)).squeeze(2)     # max over time
        return self.fc(h)


@case("review_textcnn_max_pool_kernel_from_channel_dim", "shapes",
      bug="the TextCNN's max-over-time pooling is F.max_pool1d(h, h.size(1)) on the (B, 32, 58) conv output: "
          "size(1) is the 32 channels, not the 58 positions, so the kernel (and stride) is 32 and the one window "
          "kept covers only the first 32 positions: a sentiment word later in the review is never seen "
          "(h.size(2) was meant)",
      cause_pattern=r"max_pool1d|max.?pool\w*[^.]*(kernel|window|size|channel|positions)|kernel[_ ]size|size\(1\)|"
                    r"size\(2\)|only (the )?first \d+ (positions|tokens|time steps)|(later|rest of the|remaining|"
                    r"last) (positions|tokens|time steps|words)[^.]*(ignored|dropped|never|discarded|not seen)|"
                    r"pool\w*[^.]*(window|channel)")
def review_textcnn_max_pool_kernel_from_channel_dim(pool_dim=1):
    seed(0)
    train = TensorDataset(*_reviews(1500, 1))
    val = TensorDataset(*_reviews(400, 2))
    model = TextCNN(pool_dim)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


def _textcnn_fact():
    h = torch.arange(58.0).expand(1, 32, 58)
    print(f"  F.max_pool1d on (1, 32, 58) with kernel h.size(1)={h.size(1)}: output length "
          f"{F.max_pool1d(h, h.size(1)).shape[-1]}, max position seen {F.max_pool1d(h, h.size(1)).max().item():.0f}")


fix("review_textcnn_max_pool_kernel_from_channel_dim",
    partial(review_textcnn_max_pool_kernel_from_channel_dim, pool_dim=2), val_acc, "val accuracy", _textcnn_fact)
