"""Shapes: five tensors laid out differently from what the next layer reads, none of which raises."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_v.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed


# --------------------------------------------------------------------------- S1: multimodal fusion, MHA not batch_first
class DominantColourVQA(nn.Module):
    """A question attends over image patches ("what colour dominates?"); copied from a seq-first tutorial."""

    def __init__(self, batch_first: bool):
        super().__init__()
        self.tok = nn.Embedding(32, 32)
        self.patch = nn.Linear(16, 32)
        self.pos = nn.Parameter(torch.randn(8, 32) * 0.02)
        self.xattn = nn.MultiheadAttention(32, 4, batch_first=batch_first)
        self.head = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 6))

    def forward(self, patches, question):
        q = self.tok(question)                       # (B, 8, 32)
        kv = self.patch(patches) + self.pos          # (B, 8, 32)
        att, _ = self.xattn(q, kv, kv, need_weights=False)
        return self.head((att + q).mean(1))


def _vqa_data(n, g, protos):
    dom = torch.randint(0, 6, (n,), generator=g)
    others = (dom[:, None] + torch.randint(1, 6, (n, 3), generator=g)) % 6
    colours = torch.cat([dom[:, None].expand(n, 5), others], 1)
    colours = torch.gather(colours, 1, torch.argsort(torch.rand(n, 8, generator=g), 1))
    patches = protos[colours] + 0.5 * torch.randn(n, 8, 16, generator=g)
    question = torch.randint(0, 32, (n, 8), generator=g)
    return patches, question, dom


def _vqa_loss(model, batch):
    patches, question, y = batch
    return F.cross_entropy(model(patches, question), y)


@case("fusion_mha_default_seq_first", "shapes",
      bug="nn.MultiheadAttention is built without batch_first=True but is fed (batch, seq, embed) tensors, so the "
          "question attends across the samples of the batch at each patch position instead of over its own image's "
          "patches.",
      cause_pattern=r"batch_first|MultiheadAttention.{0,120}(\(seq|seq(uence)?[- ]first|\(L, ?N|batch.{0,20}(second|dim(ension)? 1))"
                    r"|(seq(uence)?|length)[- ]first|\(seq(uence)?([_ ]len(gth)?)?, ?batch|batch (dim\w*|axis) (is )?"
                    r"(treated|read|used) as (the )?seq\w*|samples attend to each other|attend\w* (across|over) (the )?"
                    r"(batch|samples|examples)|across (the )?(samples|examples) (of|in) (the|a|each) batch")
def fusion_mha(fixed: bool = False):
    seed(0)
    g = gen(1)
    protos = torch.randn(6, 16, generator=g) * 1.5
    p, q, y = _vqa_data(1600, g, protos)
    model = DominantColourVQA(batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(p[:1200], q[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(p[1200:], q[1200:], y[1200:]), 64, shuffle=False),
                loss_fn=_vqa_loss, max_steps=300)


fix("fusion_mha_default_seq_first", fixed_of(fusion_mha),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val accuracy (dominant colour)")


# --------------------------------------------------------------------------- S2: GRU h_n flattened with view
class LoadGRU(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.gru = nn.GRU(1, 32, num_layers=2, batch_first=True)
        self.out = nn.Linear(64, 1)

    def forward(self, x):
        _, h_n = self.gru(x)                         # h_n: (num_layers, batch, hidden)
        if self.fixed:
            feats = h_n.permute(1, 0, 2).reshape(x.size(0), -1)
        else:
            feats = h_n.view(x.size(0), -1)          # "both layers' last states, one row per sample"
        return self.out(feats).squeeze(-1)


def _sine_windows(n, g, window=24):
    t = torch.arange(window + 1, dtype=torch.float32)
    f = 0.05 + 0.1 * torch.rand(n, 1, generator=g)
    phase = 6.283 * torch.rand(n, 1, generator=g)
    amp = 0.5 + torch.rand(n, 1, generator=g)
    s = amp * torch.sin(6.283 * f * t + phase) + 0.05 * torch.randn(n, window + 1, generator=g)
    return s[:, :window, None], s[:, window]


@case("gru_final_states_view_mixes_samples", "shapes",
      bug="The GRU's h_n, shaped (num_layers, batch, hidden), is flattened with h_n.view(batch, -1), which stitches "
          "the final states of different samples into one row, so each forecast is made from other windows' states.",
      cause_pattern=r"h_n|\(num_layers(\s*\*\s*num_directions)?, ?batch|hidden state.{0,80}(view|reshape|flatten)"
                    r"|(view|reshape)\(.{0,30}\).{0,80}(num_layers|layers? (first|dim))|permute\(1, ?0, ?2\)"
                    r"|transpose\(0, ?1\).{0,60}(before|then) (the )?(view|reshape)|h(idden)?\[-1\]"
                    r"|(states|rows) (of|from) different (samples|windows|sequences)")
def gru_view(fixed: bool = False):
    seed(0)
    x, y = _sine_windows(1900, gen(2))
    model = LoadGRU(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 32),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("gru_final_states_view_mixes_samples", fixed_of(gru_view), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE",
    higher=False)


# --------------------------------------------------------------------------- S3: HAR windows, view instead of transpose
class ActivityCNN(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.net = nn.Sequential(nn.Conv1d(3, 16, 7, padding=3), nn.ReLU(), nn.Conv1d(16, 16, 5, padding=2), nn.ReLU(),
                                 nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, 3))

    def forward(self, x):                            # x: (batch, time=64, axes=3), as read from the CSV
        if self.fixed:
            x = x.transpose(1, 2)
        else:
            x = x.view(x.size(0), 3, 64)             # Conv1d wants (batch, channels, length)
        return self.net(x)


def _har_data(n, g):
    y = torch.randint(0, 3, (n,), generator=g)
    t = torch.arange(64, dtype=torch.float32)
    f = 0.08 + 0.12 * torch.rand(n, 1, generator=g)
    wave = torch.sin(6.283 * f * t + 6.283 * torch.rand(n, 1, generator=g))
    x = 0.3 * torch.randn(n, 64, 3, generator=g)
    x[torch.arange(n), :, y] += wave
    return x, y


@case("har_windows_view_not_transpose", "shapes",
      bug="The (batch, time, axes) accelerometer windows are turned into Conv1d's (batch, channels, length) with "
          "x.view(B, 3, 64) instead of x.transpose(1, 2), which interleaves the three axes' samples inside every "
          "channel instead of swapping the dimensions.",
      cause_pattern=r"(view|reshape)\(.{0,30}\).{0,30}instead of (a )?(transpose|permute)|(transpose|permute)\(.{0,12}\)"
                    r".{0,40}instead of (a )?(view|reshape)|(view|reshape)\w* (does not|doesn't|cannot|can't|won't) "
                    r"(swap|transpose|permute|reorder)|interleav\w*|(scrambl|mix)\w* .{0,30}(time steps|axes|channels)"
                    r"|channels?[- ]last.{0,80}conv1d|conv1d.{0,80}channels?[- ]last")
def har_view(fixed: bool = False):
    seed(0)
    x, y = _har_data(1600, gen(3))
    model = ActivityCNN(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("har_windows_view_not_transpose", fixed_of(har_view), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")


# --------------------------------------------------------------------------- S4: sessions as lists, default_collate
class Sessions(Dataset):
    """Sessions as the JSON export has them: {"items": [item ids]}."""

    def __init__(self, seqs):
        self.seqs = seqs.tolist()

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return {"items": self.seqs[i]}


class NextItemGRU(nn.Module):
    def __init__(self, n_items=40):
        super().__init__()
        self.emb = nn.Embedding(n_items, 32)
        self.gru = nn.GRU(32, 64, batch_first=True)
        self.out = nn.Linear(64, n_items)

    def forward(self, seq):                          # seq: (batch, time)
        h, _ = self.gru(self.emb(seq))
        return self.out(h)


def _sessions(n, g, n_items=40, length=12):
    start = torch.randint(0, n_items, (n, 1), generator=g)
    step = torch.randint(1, 4, (n, 1), generator=g)
    return (start + step * torch.arange(length)) % n_items


def _stacked(batch, fixed):
    return torch.stack(batch["items"], dim=1) if fixed else torch.stack(batch["items"])


def _next_item_loss(fixed):
    def loss_fn(model, batch):
        seq = _stacked(batch, fixed)
        logits = model(seq[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), seq[:, 1:].reshape(-1))
    return loss_fn


@case("session_lists_default_collate", "shapes",
      bug="The Dataset returns Python lists of item ids, so default_collate turns each batch into a list of seq_len "
          "tensors of shape (batch,), and torch.stack(batch['items']) builds a (seq_len, batch) tensor that the "
          "batch_first GRU reads as sequences running across the samples.",
      cause_pattern=r"default_collate|collate\w*.{0,80}(lists?|transpos)|list of (\d+ |seq_len |length[- ]\d+ )?tensors"
                    r"|(python )?lists? of (item )?ids|torch\.stack\(.{0,40}dim ?= ?1|\(seq(uence)?[_ ]len(gth)?, ?batch\)"
                    r"|sequences? running across|transpos\w* .{0,40}(batch|sequence|time)")
def session_lists(fixed: bool = False):
    seed(0)
    seqs = _sessions(1500, gen(4))
    model = NextItemGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(Sessions(seqs[:1200]), 32),
                val_loader=loader(Sessions(seqs[1200:]), 100, shuffle=False),
                loss_fn=_next_item_loss(fixed), max_steps=300)


def _last_item(m, b):
    seq = torch.stack(b["items"], dim=1)
    return m(seq[:, :-1])[:, -1].argmax(-1), seq[:, -1]


fix("session_lists_default_collate", fixed_of(session_lists), acc_of(_last_item), "val next-item accuracy")


# --------------------------------------------------------------------------- S5: mel (n_mels, time) pooled on mel axis
class BandTagger(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 5))

    def forward(self, spec):                         # spec from torchaudio.transforms.MelSpectrogram: (B, n_mels, time)
        pooled = spec.mean(dim=2) if self.fixed else spec.mean(dim=1)  # "average over time"
        return self.mlp(pooled)


def _band_specs(n, g):
    y = torch.randint(0, 5, (n,), generator=g)
    centre = (4 + 6 * y).float()
    mel = torch.arange(32, dtype=torch.float32)
    profile = torch.exp(-0.5 * ((mel[None] - centre[:, None]) / 1.2) ** 2)           # (n, 32)
    start = torch.randint(0, 20, (n, 1), generator=g)
    dur = torch.randint(6, 13, (n, 1), generator=g)
    frames = torch.arange(32)[None]
    on = ((frames >= start) & (frames < start + dur)).float()                         # (n, 32)
    loud = 0.5 + torch.rand(n, 1, 1, generator=g)
    spec = loud * profile[:, :, None] * on[:, None, :] + 0.2 * torch.rand(n, 32, 32, generator=g)
    return spec, y


@case("melspec_pooled_over_mel_axis", "shapes",
      bug="torchaudio's MelSpectrogram output is laid out (batch, n_mels, time) but the model pools it with "
          "spec.mean(dim=1) as if it were (batch, time, n_mels), averaging away the mel axis that carries the class "
          "and keeping only a frame-energy profile.",
      cause_pattern=r"n_mels|mel (axis|bins?|dim\w*|bands?)|\(batch, ?(n_)?mels?, ?(time|frames)\)|mean\(dim ?= ?1\)"
                    r"|pool\w* (over|across) (the )?(wrong|frequency|mel)|(frequency|freq) (axis|dim\w*)"
                    r"|(averag|pool|mean)\w* .{0,40}(instead of|rather than) (over )?(the )?(time|frames)")
def mel_pool(fixed: bool = False):
    seed(0)
    x, y = _band_specs(1600, gen(5))
    model = BandTagger(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("melspec_pooled_over_mel_axis", fixed_of(mel_pool), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")
