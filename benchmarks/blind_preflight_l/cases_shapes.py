"""Set l, family shapes: tensors of the wrong layout that broadcast, reshape or pad without an error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_l.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

# --------------------------------------------------------------------------------------------------------------------
# A message-passing net in plain torch (no PyG): graphs batched as one disjoint graph with a `batch` vector.


def _random_graphs(n: int, s: int):
    g = gen(s)
    graphs = []
    for _ in range(n):
        k = int(torch.randint(6, 15, (1,), generator=g))
        adj = torch.rand(k, k, generator=g) < 0.3
        adj = torch.triu(adj, 1)
        src, dst = adj.nonzero(as_tuple=True)
        edge_index = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], 1)
        x = torch.randn(k, 4, generator=g)
        neigh = torch.zeros(k).index_add_(0, edge_index[1], x[edge_index[0], 0])
        deg = torch.bincount(edge_index[1], minlength=k).float()
        graphs.append((x, edge_index, (neigh.mean() + 0.3 * deg.mean()).item()))
    ys = torch.tensor([y for *_, y in graphs])
    mu, sd = ys.mean(), ys.std()
    return [(x, ei, (y - mu.item()) / sd.item()) for x, ei, y in graphs]


def collate_graphs(items):
    xs, eis, bs, ys, offset = [], [], [], [], 0
    for i, (x, ei, y) in enumerate(items):
        xs.append(x)
        eis.append(ei + offset)
        bs.append(torch.full((x.size(0),), i, dtype=torch.long))
        ys.append(y)
        offset += x.size(0)
    return torch.cat(xs), torch.cat(eis, 1), torch.cat(bs), torch.tensor(ys, dtype=torch.float32)


class GraphRegressor(nn.Module):
    def __init__(self, d_in=4, hidden=32):
        super().__init__()
        self.inp = nn.Linear(d_in, hidden)
        self.msg1 = nn.Linear(hidden, hidden)
        self.msg2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 1)

    @staticmethod
    def propagate(h, edge_index):
        src, dst = edge_index
        return torch.zeros_like(h).index_add_(0, dst, h[src])

    def forward(self, x, edge_index, batch=None):
        h = F.relu(self.inp(x))
        h = F.relu(self.msg1(h + self.propagate(h, edge_index)))
        h = F.relu(self.msg2(h + self.propagate(h, edge_index)))
        if batch is None:  # one molecule at inference time
            g = h.mean(0, keepdim=True)
        else:
            n = int(batch.max()) + 1
            g = torch.zeros(n, h.size(1), device=h.device, dtype=h.dtype).index_add_(0, batch, h)
            g = g / torch.bincount(batch, minlength=n).clamp(min=1).unsqueeze(1).to(h.dtype)
        return self.out(g)


def _graph_pool_loss(with_batch: bool):
    def loss_fn(model, batch):
        x, edge_index, b, y = batch
        pred = model(x, edge_index, b) if with_batch else model(x, edge_index)
        return F.mse_loss(pred.squeeze(-1), y)
    return loss_fn


@case("shapes_graph_readout_without_batch_vector", "shapes",
      bug="The training loss calls the GNN as model(x, edge_index) without the batch assignment vector, so the "
          "readout's batch=None branch mean-pools the nodes of all graphs in the batch into one vector: the model "
          "makes a single prediction of shape (1,) that F.mse_loss broadcasts against the (32,) per-graph targets.",
      cause_pattern=r"batch (assignment )?vector|batch=None|without (the )?batch|pass(es|ing)? (the )?batch\b|"
                    r"(pool|readout|mean).{0,60}(all|every|whole|entire) (the )?(graphs|nodes)|one (single )?"
                    r"(prediction|vector|output) for (the )?(whole|entire|all)|\(1,?\).{0,80}\((32|64),?\)|"
                    r"torch\.Size\(\[1\]\).{0,80}torch\.Size\(\[(32|64)\]\)|per-graph|graph-level")
def graph_readout(fixed: bool = False):
    seed(0)
    train = _random_graphs(1024, 1)
    val = _random_graphs(256, 2)
    model = GraphRegressor()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, collate_fn=collate_graphs),
                val_loader=DataLoader(val, batch_size=64, collate_fn=collate_graphs),
                loss_fn=_graph_pool_loss(fixed), max_steps=3000)


fix("shapes_graph_readout_without_batch_vector", fixed_of(graph_readout),
    rmse_of(lambda m, b: (m(b[0], b[1], b[2]).squeeze(-1), b[3])), "val RMSE (per-graph readout)", higher=False)

# --------------------------------------------------------------------------------------------------------------------
# A packed GRU over shopping sessions of variable length, the "last time step" read from the padded output.


def _sessions(n: int, s: int, max_len: int = 30):
    g = gen(s)
    y = torch.randint(0, 2, (n,), generator=g)
    lengths = torch.randint(3, max_len + 1, (n,), generator=g)
    tokens = torch.zeros(n, max_len, dtype=torch.long)
    for i in range(n):
        k = int(lengths[i])
        seq = torch.randint(3, 30, (k,), generator=g)
        where = torch.randperm(k, generator=g)[: max(1, k // 5)]
        seq[where] = 1 if y[i] == 1 else 2
        tokens[i, :k] = seq
    return tokens, lengths, y


class SessionGRU(nn.Module):
    def __init__(self, read_h_n: bool):
        super().__init__()
        self.read_h_n = read_h_n
        self.emb = nn.Embedding(30, 16, padding_idx=0)
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.fc = nn.Linear(32, 2)

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(self.emb(tokens), lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, h_n = self.gru(packed)
        if self.read_h_n:
            feat = h_n[-1]
        else:
            out, _ = pad_packed_sequence(out, batch_first=True)
            feat = out[:, -1]  # the last time step, as Keras' return_sequences=False
        return self.fc(feat)


def _session_loss(model, batch):
    tokens, lengths, y = batch
    return F.cross_entropy(model(tokens, lengths), y)


@case("shapes_packed_gru_padded_last_step", "shapes",
      bug="After pack_padded_sequence / pad_packed_sequence the classifier reads out[:, -1], the last padded time "
          "step: for every session shorter than the longest in its batch that row is the zero padding, not the "
          "GRU's last real output, so most sessions are classified from a zero vector (use h_n[-1] or gather at "
          "lengths - 1).",
      cause_pattern=r"h_n|out(put)?\[:, ?-1\]|lengths? ?- ?1|pad_packed_sequence|padded (time )?step|"
                    r"(last|final) (real|valid|non-pad\w*) (time ?step|output|element)|zero (padding|vector)s? "
                    r"(instead|rather)|padding (value|zeros?) .{0,40}(classif|read|last)")
def packed_gru(fixed: bool = False):
    seed(0)
    tokens, lengths, y = _sessions(2048, 3)
    vt, vl, vy = _sessions(512, 4)
    model = SessionGRU(read_h_n=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(tokens, lengths, y), 32),
                val_loader=DataLoader(TensorDataset(vt, vl, vy), batch_size=128),
                loss_fn=_session_loss, max_steps=2000)


fix("shapes_packed_gru_padded_last_step", fixed_of(packed_gru),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val accuracy")

# --------------------------------------------------------------------------------------------------------------------
# Keyword spotting on log-mel frames with a sequence-first nn.LSTM; (B, T, M) "reshaped" with .view.


def _keywords(n: int, s: int, T: int = 20, M: int = 16):
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    x = 0.5 * torch.randn(n, T, M, generator=g)
    start = torch.randint(0, T - 6, (n,), generator=g)
    for i in range(n):
        t0, c = int(start[i]), int(y[i])
        for k in range(6):  # a rising, falling or flat sweep through the mel bands
            band = [4 + k, 11 - k, 8][c]
            x[i, t0 + k, band] += 2.5
    return x, y


class KeywordLSTM(nn.Module):
    def __init__(self, transpose: bool, n_mels=16, hidden=32):
        super().__init__()
        self.transpose = transpose
        self.lstm = nn.LSTM(n_mels, hidden)  # sequence-first, as in the tutorial it came from
        self.fc = nn.Linear(hidden, 3)

    def forward(self, x):  # x: (batch, time, mels) from the DataLoader
        if self.transpose:
            x = x.transpose(0, 1)
        else:
            x = x.view(x.size(1), x.size(0), x.size(2))  # (time, batch, mels) for nn.LSTM
        _, (h, _) = self.lstm(x)
        return self.fc(h[-1])


@case("shapes_lstm_input_view_instead_of_transpose", "shapes",
      bug="The (batch, time, mels) frames are turned into the (time, batch, mels) layout a sequence-first nn.LSTM "
          "expects with x.view(T, B, M) instead of x.transpose(0, 1): the shape matches but view reinterprets the "
          "memory, so each 'sequence' the LSTM reads is stitched from frames of different clips and its prediction "
          "is scored against another clip's label.",
      cause_pattern=r"\.view\(\s*(t\b|T\b|x\.size\(1\)|seq|time)|view\b.{0,60}(instead of|rather than|not) .{0,20}(transpose|permute)|"
                    r"(transpose|permute)\(.{0,80}(instead of|rather than|not) .{0,20}view|batch_first|"
                    r"(mix|stitch|interleav|scrambl|shuffl)\w* .{0,60}(across|between|different) (samples|clips|"
                    r"sequences|batch)|reinterpret\w* (the )?memory")
def lstm_view(fixed: bool = False):
    seed(0)
    x, y = _keywords(2048, 5)
    vx, vy = _keywords(512, 6)
    model = KeywordLSTM(transpose=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=DataLoader(TensorDataset(vx, vy), 128),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("shapes_lstm_input_view_instead_of_transpose", fixed_of(lstm_view),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")

# --------------------------------------------------------------------------------------------------------------------
# A land-cover classifier ending in LogSoftmax over dim=0 (the batch) with NLLLoss.


@case("shapes_log_softmax_over_batch_dim", "shapes",
      bug="The classifier ends in nn.LogSoftmax(dim=0), so the log-probabilities are normalised over the batch "
          "dimension (each class column sums to one across the 64 samples) instead of over the 6 classes; "
          "nn.NLLLoss then trains a ranking of samples per class whose per-class offsets are free, and the argmax "
          "over classes is not a prediction.",
      cause_pattern=r"dim ?= ?0|dim 0\b|(over|across|along) (the )?(batch|samples|first) (dim|axis|dimension)|"
                    r"batch (dim|axis|dimension)|dim ?= ?(1|-1)|(normali[sz]\w*|sum\w*) (over|across) (the )?batch")
def log_softmax_dim0(fixed: bool = False):
    seed(0)
    g = gen(7)
    x = torch.randn(3072, 10, generator=g)
    w = torch.randn(10, 6, generator=g)
    logits = x @ w + 0.7 * torch.randn(6, generator=g)
    y = logits.argmax(1)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 6), nn.LogSoftmax(dim=1 if fixed else 0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=DataLoader(TensorDataset(x[2560:], y[2560:]), 512),
                loss_fn=nn.NLLLoss(), max_steps=1500)


fix("shapes_log_softmax_over_batch_dim", fixed_of(log_softmax_dim0),
    acc_of(lambda m, b: (m[:-1](b[0]).argmax(-1), b[1])), "val accuracy (argmax of the logits)")

# --------------------------------------------------------------------------------------------------------------------
# A vibration-signal autoencoder whose dataset returns the target with an extra channel dim.


class VibrationWindows(torch.utils.data.Dataset):
    def __init__(self, n: int, s: int, L: int = 64):
        g = gen(s)
        t = torch.arange(L, dtype=torch.float32)
        f = 0.05 + 0.25 * torch.rand(n, 1, generator=g)
        ph = 6.28 * torch.rand(n, 1, generator=g)
        a = 0.5 + torch.rand(n, 1, generator=g)
        self.x = a * torch.sin(6.28 * f * t + ph) + 0.05 * torch.randn(n, L, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.x[i].unsqueeze(0)  # (1, L): the channel dim the old Conv1d version needed


class FlatWindows(VibrationWindows):
    def __getitem__(self, i):
        return self.x[i], self.x[i]


@case("shapes_autoencoder_target_extra_channel_dim", "shapes",
      bug="The dataset returns each reconstruction target as x.unsqueeze(0), so targets batch to (32, 1, 64) while "
          "the autoencoder outputs (32, 64); nn.MSELoss broadcasts them to (32, 32, 64), comparing every output "
          "with every target in the batch, and the autoencoder learns to output the batch-mean signal.",
      cause_pattern=r"\(32, ?1, ?64\)|\[32, ?1, ?64\]|(32, ?32, ?64)|unsqueeze\(0\)|extra (channel |singleton )?"
                    r"dim.{0,60}target|target.{0,60}extra (channel |singleton )?dim|every output .{0,40}every target|"
                    r"(batch|the) mean (signal|reconstruction)")
def ae_target(fixed: bool = False):
    seed(0)
    ds = FlatWindows if fixed else VibrationWindows
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16), nn.ReLU(), nn.Linear(16, 128),
                          nn.ReLU(), nn.Linear(128, 64))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(ds(2048, 8), 32), val_loader=DataLoader(FlatWindows(512, 9), 128),
                loss_fn=nn.MSELoss(), max_steps=3000)


fix("shapes_autoencoder_target_extra_channel_dim", fixed_of(ae_target),
    rmse_of(lambda m, b: (m(b[0]), b[0])), "val reconstruction RMSE", higher=False)
