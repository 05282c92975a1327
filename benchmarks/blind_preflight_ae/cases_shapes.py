"""Set ae, family shapes: tensors whose layout is silently wrong (broadcasting, seq-first, view vs permute, ...)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ae.models import GRUSeq2Seq, MLPEncoder, seq2seq_batches
from benchmarks.blind_preflight_ae.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    retrieval_top1,
    rmse_of,
    seed,
    smooth_signals,
    token_sequences,
)


# 1. A vibration-window autoencoder: the windows keep the conv pipeline's channel dim (N, 1, 64) as targets while the
#    MLP reconstructs (N, 64); MSELoss broadcasts (B, 64) against (B, 1, 64) to (B, B, 64) and learns the batch mean.
@case("ae_vibration_target_keeps_channel_dim", "shapes",
      bug="The autoencoder outputs (B, 64) but its targets are the windows as stored, (B, 1, 64); nn.MSELoss "
          "broadcasts them to (B, B, 64), comparing every reconstruction with every window of the batch, so the "
          "decoder learns the batch-mean window; flatten the targets to (B, 64) (or return the output as (B, 1, 64)).",
      cause_pattern=r"\(\s*B\s*,\s*B\s*,|\(\s*(\d+)\s*,\s*\1\s*,\s*\d+\s*\)|\(\s*\d+\s*,\s*1\s*,\s*\d+\s*\).{0,120}\(\s*\d+\s*,\s*\d+\s*\)"
                    r"|\(\s*\d+\s*,\s*\d+\s*\).{0,120}\(\s*\d+\s*,\s*1\s*,\s*\d+\s*\)|every (reconstruction|output|prediction)"
                    r".{0,40}every (window|target|sample)|batch[- ]mean (window|reconstruction|output)"
                    r"|(extra|singleton|channel) dim\w*.{0,60}(target|window)|(target|window)s?.{0,60}(extra|singleton|channel) dim")
def vibration_ae(fixed: bool = False):
    seed(0)
    x = smooth_signals(1200, 64, rank=4, s=1).unsqueeze(1)          # (N, 1, 64), as the conv pipeline stored them
    train, val = x[:1000], x[1000:]
    targets = train.flatten(1) if fixed else train
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8), nn.ReLU(),
                          nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(train, targets), 50),
                val_loader=loader(TensorDataset(val, val.flatten(1)), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=3000)


fix("ae_vibration_target_keeps_channel_dim", fixed_of(vibration_ae),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val reconstruction RMSE", higher=False)


# 2. A masked-token pretraining transformer fed (batch, seq, dim) to nn.TransformerEncoderLayer without
#    batch_first=True: attention runs across the batch at each position, never across a sequence's own tokens.
class TinyMLM(nn.Module):
    def __init__(self, vocab: int, length: int, d: int = 64, batch_first: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(length, d) * 0.1)
        layer = nn.TransformerEncoderLayer(d, 4, 128, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        return self.head(self.encoder(self.tok(ids) + self.pos[: ids.shape[1]]))


MASK_ID = 1


def masked_tokens(n: int, length: int, vocab: int, s: int):
    ids = token_sequences(n, length, vocab, s=s, low=3)
    g = gen(s + 100)
    chosen = torch.rand(n, length, generator=g) < 0.2
    chosen[torch.arange(n), torch.randint(0, length, (n,), generator=g)] = True
    return ids.masked_fill(chosen, MASK_ID), ids.masked_fill(~chosen, -100)


def mlm_loss(model, batch):
    ids, labels = batch
    logits = model(ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


@case("mlm_transformer_layer_seq_first", "shapes",
      bug="The masked-token model feeds (batch, seq, dim) embeddings to nn.TransformerEncoderLayer built without "
          "batch_first=True, which reads them as (seq, batch, dim): self-attention mixes the batch's sequences at each "
          "position and never the tokens of one sequence, so a [MASK] cannot see its context; pass batch_first=True.",
      cause_pattern=r"(Transformer\w*|MultiheadAttention|self-attention|attention).{0,100}batch_first"
                    r"|batch_first.{0,100}(Transformer\w*|MultiheadAttention|attention)"
                    r"|attention.{0,40}(across|over|mixes) (the )?(batch|different (samples|sequences|examples))"
                    r"|\(\s*seq\w*\s*,\s*batch\w*\s*,\s*(dim|d_model|embed\w*|feature\w*)\s*\)")
def mlm_seq_first(fixed: bool = False):
    seed(0)
    vocab, length = 24, 16
    x, y = masked_tokens(2000, length, vocab, s=3)
    vx, vy = masked_tokens(400, length, vocab, s=4)
    model = TinyMLM(vocab, length, batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(vx, vy), 200, shuffle=False), loss_fn=mlm_loss, max_steps=4000)


fix("mlm_transformer_layer_seq_first", fixed_of(mlm_seq_first),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val masked-token accuracy", steps=400)


# 3. A GRU encoder-decoder (teacher forcing, sorting task): the logits (B, T, V) are handed to cross_entropy as
#    logits.view(B, V, T) instead of logits.permute(0, 2, 1), which scrambles classes and positions.
def seq_ce_view(model, batch):
    src, dec_in, tgt = batch
    logits = model(src, dec_in)
    b, t, v = logits.shape
    return F.cross_entropy(logits.view(b, v, t), tgt)


def seq_ce_permute(model, batch):
    src, dec_in, tgt = batch
    return F.cross_entropy(model(src, dec_in).permute(0, 2, 1), tgt)


@case("seq2seq_logits_view_not_permute", "shapes",
      bug="The decoder's logits (B, T, V) are reshaped for F.cross_entropy with logits.view(B, V, T) instead of "
          "logits.permute(0, 2, 1) (or transpose(1, 2)): view keeps the memory order, so each 'class' column mixes "
          "scores of different positions and vocabulary entries and the targets are scored against scrambled logits.",
      cause_pattern=r"\.?view\(\s*\w+\s*,\s*(V|vocab\w*|num_classes|C)\s*,\s*(T|seq\w*|len\w*)\s*\)"
                    r"|view\b.{0,60}instead of.{0,30}(permute|transpose)|(permute|transpose)\w*.{0,40}instead of.{0,30}\bview"
                    r"|(view|reshape)\w*.{0,80}(scrambl|interleav|mix(es|ing)? (positions|classes|time))"
                    r"|(scrambl|interleav)\w*.{0,80}(class|vocab|position|logit)")
def seq2seq_view(fixed: bool = False):
    seed(0)
    vocab, length = 12, 6
    src, dec_in, tgt = seq2seq_batches(3000, length, vocab, "sort", s=5)
    vs, vd, vt = seq2seq_batches(500, length, vocab, "sort", s=6)
    model = GRUSeq2Seq(vocab)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(src, dec_in, tgt), 64),
                val_loader=loader(TensorDataset(vs, vd, vt), 250, shuffle=False),
                loss_fn=seq_ce_permute if fixed else seq_ce_view, max_steps=3000, clip_grad_norm=1.0)


fix("seq2seq_logits_view_not_permute", fixed_of(seq2seq_view),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val teacher-forced token accuracy", steps=400)


# 4. SimCLR on sensor windows: both views go through the encoder as torch.cat([v1, v2]) and are split back with
#    z.view(B, 2, D) instead of z.chunk(2), so each "positive pair" is two different windows of view 1 (or view 2).
def views(x, noise: float = 0.9):
    scale = 1 + 0.3 * torch.randn(x.shape[0], 1, device=x.device)
    return x * scale + noise * torch.randn_like(x)


def simclr_loss(split_chunk: bool):
    def loss_fn(model, batch):
        (x,) = batch
        b = x.shape[0]
        z = model(torch.cat([views(x), views(x)]))
        z1, z2 = z.chunk(2) if split_chunk else z.view(b, 2, -1).unbind(1)
        z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
        logits = z1 @ z2.T / 0.2
        return F.cross_entropy(logits, torch.arange(b, device=x.device))
    return loss_fn


@case("simclr_views_split_with_view", "shapes",
      bug="The two augmented views are encoded as torch.cat([v1, v2]) (rows 0..B-1 view 1, B..2B-1 view 2) but split "
          "back with z.view(B, 2, D).unbind(1), which pairs rows 2i and 2i+1: every 'positive pair' is two different "
          "windows of the same view, so InfoNCE pulls unrelated samples together; split with z.chunk(2).",
      cause_pattern=r"view\(\s*\w+\s*,\s*2\s*,|chunk\(\s*2\s*\)|rows? 2i|interleav\w+"
                    r"|positive pairs?.{0,80}(different|unrelated|wrong|other) (windows?|samples?|instances?|images?|rows?)"
                    r"|(different|unrelated) (samples|windows|instances).{0,60}(as|treated as|paired as) positives?")
def simclr_split(fixed: bool = False):
    seed(0)
    x = smooth_signals(1800, 48, rank=12, s=7)
    train, val = x[:1500], x[1500:]
    g = gen(8)
    scale = lambda n: 1 + 0.3 * torch.randn(n, 1, generator=g)  # noqa: E731
    v1 = val * scale(len(val)) + 0.9 * torch.randn(val.shape, generator=g)
    v2 = val * scale(len(val)) + 0.9 * torch.randn(val.shape, generator=g)
    model = MLPEncoder(48, 128, 32)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(train), 128, drop_last=True),
                val_loader=loader(TensorDataset(v1, v2), 300, shuffle=False),
                loss_fn=simclr_loss(split_chunk=fixed), max_steps=2000)


def view_retrieval(model, kw):
    model.eval()
    with torch.no_grad():
        v1, v2 = next(iter(kw["val_loader"]))
        dev = next(model.parameters()).device
        out = retrieval_top1(model(v1.to(dev)), model(v2.to(dev)))
    model.train()
    return out


fix("simclr_views_split_with_view", fixed_of(simclr_split), view_retrieval, "val view-to-view top-1 retrieval")


# 5. A GRU next-token model over variable-length click sessions: the collate pads with pad_sequence's default
#    batch_first=False, giving (T, B), while the GRU is batch_first=True: it recurs over the batch, not over time.
def session_collate(batch_first: bool):
    def collate(seqs):
        xs = pad_sequence([s[:-1] for s in seqs], batch_first=batch_first, padding_value=0)
        ys = pad_sequence([s[1:] for s in seqs], batch_first=batch_first, padding_value=-100)
        return xs, ys
    return collate


class SessionGRU(nn.Module):
    def __init__(self, vocab: int, d: int = 64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.gru = nn.GRU(d, 96, batch_first=True)
        self.head = nn.Linear(96, vocab)

    def forward(self, x):
        return self.head(self.gru(self.emb(x))[0])


def sessions(n: int, vocab: int, s: int):
    g = gen(s)
    full = token_sequences(n, 16, vocab, s=s, low=3)
    lengths = torch.randint(7, 17, (n,), generator=g)
    return [full[i, : lengths[i]] for i in range(n)]


@case("session_lm_pad_sequence_time_major", "shapes",
      bug="The DataLoader's collate_fn pads the sessions with torch.nn.utils.rnn.pad_sequence without "
          "batch_first=True, so batches come out time-major (T, B) while the GRU is batch_first=True: the recurrence "
          "runs across the sessions of a batch instead of along each session; pass batch_first=True to pad_sequence.",
      cause_pattern=r"pad_sequence|time[- ]major|collate\w*.{0,80}\(\s*T\s*,\s*B\s*\)|\(\s*T\s*,\s*B\s*\).{0,80}batch_first"
                    r"|recurr?\w*.{0,40}(across|over|along) (the )?(batch|sessions of a batch|different (sequences|sessions))")
def session_lm(fixed: bool = False):
    seed(0)
    vocab = 24
    collate = session_collate(batch_first=fixed)
    model = SessionGRU(vocab)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(sessions(2000, vocab, 9), 32, collate_fn=collate),
                val_loader=loader(sessions(400, vocab, 10), 100, shuffle=False, collate_fn=collate),
                loss_fn=lambda m, b: F.cross_entropy(m(b[0]).reshape(-1, vocab), b[1].reshape(-1), ignore_index=-100),
                max_steps=3000)


fix("session_lm_pad_sequence_time_major", fixed_of(session_lm),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val next-token accuracy")
