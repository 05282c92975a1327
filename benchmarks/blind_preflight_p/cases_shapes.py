"""Shapes family: five real user bugs where a tensor's layout or shape is silently wrong (no crash)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.blind_preflight_p.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed, split

# --------------------------------------------------------------------------------------------------------------------
# 1. Rent regression: (64, 1) predictions against a (64,) target column, MSELoss broadcasts to (64, 64).


def _rent_table(n: int, s: int):
    """A listings table as a user would have it after df[...].values: 8 standardised columns, rent in 1000s."""
    g = gen(s)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, generator=g) / 8 ** 0.5
    rent = 1.2 * torch.tanh(x @ w) + 0.6 * x[:, 2] * x[:, 5] + 0.4 * x[:, 0] + 0.1 * torch.randn(n, generator=g)
    return x, rent


@case("shapes_rent_mse_broadcast", "shapes",
      bug="The rent target is a 1-D column (64,) while the model outputs (64, 1): nn.MSELoss broadcasts them to a "
          "(64, 64) matrix, so every prediction is pulled towards every rent in the batch and the model learns the "
          "batch mean.",
      fix_line="Keep the target as a column: TensorDataset(X, y.view(-1, 1)) (or squeeze the output to (64,)).",
      source="https://solofox.github.io/torch/broadcasting/2025/12/07/torch-broadcasting-trap.html",
      cause_pattern=r"\(\s*64\s*,\s*64\s*\)|\[\s*64\s*,\s*64\s*\]|64\s*[x×]\s*64|mse_?loss.{0,120}broadcast|"
                    r"broadcast.{0,120}mse_?loss|\(\s*64\s*,\s*1\s*\).{0,80}\(\s*64\s*,?\s*\)|"
                    r"\[\s*64\s*,\s*1\s*\].{0,80}\[\s*64\s*\]|"
                    r"\b(y|targets?|labels?|rent)\w*\.(unsqueeze\(\s*-?1\s*\)|view\(\s*-1\s*,\s*1\s*\)|"
                    r"reshape\(\s*-1\s*,\s*1\s*\))",
      paraphrases=("MSELoss receives input torch.Size([64, 1]) and target torch.Size([64]); broadcasting turns the "
                   "loss into a 64x64 matrix of all pairs, so the regressor only learns the mean rent.",
                   "The loss is computed over (64, 64) broadcast pairs: reshape the targets with y.view(-1, 1) so "
                   "they match the (64, 1) predictions."))
def rent_mse_broadcast(fixed: bool = False) -> dict:
    seed(0)
    x, rent = _rent_table(2000, 1)
    y = rent.view(-1, 1) if fixed else rent          # df["rent"].values -> a flat column
    (xt, yt), (xv, yv) = split(x, y, 1600)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 64), val_loader=loader(TensorDataset(xv, yv), 64, False),
                loss_fn=nn.MSELoss(), max_steps=2000)


fix("shapes_rent_mse_broadcast", fixed_of(rent_mse_broadcast), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE (rent, 1000s)", steps=250, higher=False)

# --------------------------------------------------------------------------------------------------------------------
# 2. Peptide activity: (batch, seq, d) fed to a TransformerEncoder built with the default batch_first=False.

CLS, PEP_LEN = 1, 16


def _peptides(n: int, s: int):
    """Token ids 2..11 for residues, CLS=1 in front; active when residue 3 outnumbers residue 4."""
    g = gen(s)
    seqs, labels = [], []
    while len(seqs) < n:
        body = torch.randint(2, 12, (PEP_LEN,), generator=g)
        c3, c4 = (body == 3).sum().item(), (body == 4).sum().item()
        if c3 == c4:
            continue
        seqs.append(torch.cat([torch.tensor([CLS]), body]))
        labels.append(int(c3 > c4))
    return torch.stack(seqs), torch.tensor(labels)


class PeptideTransformer(nn.Module):
    def __init__(self, batch_first: bool):
        super().__init__()
        self.emb = nn.Embedding(12, 32)
        self.pos = nn.Parameter(torch.randn(1, PEP_LEN + 1, 32) * 0.02)
        layer = nn.TransformerEncoderLayer(32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 2)

    def forward(self, tokens):                       # tokens: (batch, 1 + 16)
        h = self.emb(tokens) + self.pos[:, : tokens.size(1)]
        h = self.encoder(h)
        return self.head(h[:, 0])                    # the [CLS] position


@case("shapes_peptide_transformer_seq_first", "shapes",
      bug="The peptides are batched (batch, seq, d) but nn.TransformerEncoderLayer is built with the default "
          "batch_first=False, so self-attention runs across the 64 peptides of the batch at each position instead of "
          "along each peptide, and the [CLS] output never sees its own residues.",
      fix_line="Build the layer with nn.TransformerEncoderLayer(..., batch_first=True) (or transpose to (seq, batch, d)).",
      source="https://github.com/Exorust/TorchLeet/issues/5",
      cause_pattern=r"batch_first|\(\s*seq(uence)?(_len)?\s*,\s*batch|seq(uence)?[- ]first|"
                    r"attend\w*.{0,40}(across|over) (the )?(batch|peptides|samples)|"
                    r"batch (axis|dimension).{0,80}(as|treated as|taken for|is) (the )?(sequence|time)|"
                    r"(sequence|time) (axis|dimension).{0,80}(as|treated as|taken for) (the )?batch",
      paraphrases=("TransformerEncoderLayer expects (seq, batch, d) by default; the model passes (batch, seq, d), so "
                   "attention mixes different peptides and each [CLS] token only attends to other [CLS] tokens.",
                   "Self-attention runs over the batch axis: the encoder treats the batch dimension as the sequence. "
                   "Pass batch_first=True when building the layer."))
def peptide_transformer_seq_first(fixed: bool = False) -> dict:
    seed(0)
    x, y = _peptides(2400, 2)
    (xt, yt), (xv, yv) = split(x, y, 2000)
    model = PeptideTransformer(batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01),
                train_loader=loader(TensorDataset(xt, yt), 64), val_loader=loader(TensorDataset(xv, yv), 128, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000, clip_grad_norm=1.0)


fix("shapes_peptide_transformer_seq_first", fixed_of(peptide_transformer_seq_first),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)

# --------------------------------------------------------------------------------------------------------------------
# 3. Support-ticket urgency: GRU over right-padded token ids, classifier reads out[:, -1] (a pad step).

MAX_LEN, TICKET_VOCAB = 48, 30


def _tickets(n: int, s: int):
    """Tickets of 3-10 tokens, post-padded with 0 to 48 (like a Keras pad_sequences(maxlen=48, padding='post'));
    urgent when the closing token is one of 1..10 (\"asap\", \"down\", ...)."""
    g = gen(s)
    ids = torch.zeros(n, MAX_LEN, dtype=torch.long)
    labels = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        length = int(torch.randint(3, 11, (1,), generator=g))
        ids[i, :length] = torch.randint(1, TICKET_VOCAB, (length,), generator=g)
        labels[i] = int(ids[i, length - 1] <= 10)
    return ids, labels


class TicketGRU(nn.Module):
    def __init__(self, last_real_step: bool):
        super().__init__()
        self.last_real_step = last_real_step
        self.emb = nn.Embedding(TICKET_VOCAB, 24, padding_idx=0)
        self.gru = nn.GRU(24, 48, batch_first=True)
        self.head = nn.Linear(48, 2)

    def forward(self, ids):
        out, _ = self.gru(self.emb(ids))
        if self.last_real_step:
            lengths = (ids != 0).sum(1)
            last = out[torch.arange(ids.size(0), device=ids.device), lengths - 1]
        else:
            last = out[:, -1]                       # the "last time step" of a post-padded batch
        return self.head(last)


@case("shapes_ticket_gru_last_pad_step", "shapes",
      bug="Tickets are post-padded to 48 tokens but the GRU classifier reads out[:, -1], the hidden state after 38-45 "
          "padding steps instead of the state at each ticket's last real token.",
      fix_line="Take the state at each sequence's real end: out[torch.arange(B), lengths - 1] (or pack_padded_sequence).",
      source="https://www.yumpu.com/en/document/view/68632516/daniel-voigt-godoy-deep-learning-with-pytorch-step-by-step-"
             "a-beginners-guide-leanpub/681",
      cause_pattern=r"pad\w*.{0,120}(last|final) (time ?step|step|position|output|hidden)|"
                    r"(last|final) (time ?step|step|position|output|hidden state).{0,120}pad|"
                    r"out(put)?\[\s*:\s*,\s*-1\s*\].{0,120}(pad|length)|pack_padded_sequence|lengths?\s*-\s*1",
      paraphrases=("The classifier takes out[:, -1], but with post-padding the last position is a pad token for most "
                   "tickets; gather the output at lengths - 1 instead.",
                   "Most of the sequence is padding, so the final time step's hidden state has run through dozens of "
                   "pad steps; use pack_padded_sequence or index the last real token."))
def ticket_gru_last_pad_step(fixed: bool = False) -> dict:
    seed(0)
    x, y = _tickets(2400, 3)
    (xt, yt), (xv, yv) = split(x, y, 2000)
    model = TicketGRU(last_real_step=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 32), val_loader=loader(TensorDataset(xv, yv), 200, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


fix("shapes_ticket_gru_last_pad_step", fixed_of(ticket_gru_last_pad_step),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# 4. Keyword spotting: (batch, frames, mels) features .view()-ed to (batch, mels, frames) for Conv1d.

N_FRAMES, N_MELS = 52, 26


def _keywords(n: int, s: int):
    """Log-mel patches (frames x mels, as librosa.feature...T gives them): each keyword is an 8-frame burst in one of
    four mel bands at a random time."""
    g = gen(s)
    x = 0.3 * torch.rand(n, N_FRAMES, N_MELS, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    t0 = torch.randint(0, N_FRAMES - 8, (n,), generator=g)
    for i in range(n):
        x[i, t0[i]:t0[i] + 8, 3 + 5 * y[i]:8 + 5 * y[i]] += 1.0
    return x, y


class KeywordCNN(nn.Module):
    def __init__(self, transpose: bool):
        super().__init__()
        self.transpose = transpose
        self.net = nn.Sequential(nn.Conv1d(N_MELS, 32, 3, padding=1), nn.ReLU(), nn.Conv1d(32, 32, 3, padding=1),
                                 nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, 4))

    def forward(self, feats):                        # feats: (batch, frames, mels)
        if self.transpose:
            x = feats.transpose(1, 2)
        else:
            x = feats.view(feats.size(0), N_MELS, -1)   # "expected 26 channels, got 52" -> view to (B, mels, frames)
        return self.net(x)


@case("shapes_keyword_view_not_transpose", "shapes",
      bug="The (batch, frames, mels) log-mel features are reshaped with .view(B, 26, -1) instead of transposed, so the "
          "Conv1d channels are chunks of consecutive frames with the 26 mel bins interleaved along time, and which mel "
          "band carries the keyword is scrambled.",
      fix_line="Swap the axes instead of reshaping: x = feats.transpose(1, 2) (or .permute(0, 2, 1)).",
      source="https://runebook.dev/ru/docs/pytorch/generated/torch.tensor.permute",
      cause_pattern=r"(view|reshape)\w*.{0,80}(instead of|rather than|not a|is not a|where).{0,30}(transpose|permute)|"
                    r"(transpose|permute)\w*.{0,80}(instead of|rather than|not).{0,30}(view|reshape)|"
                    r"transpose\(\s*1\s*,\s*2\s*\)|permute\(\s*0\s*,\s*2\s*,\s*1\s*\)|(scrambl|interleav)\w*.{0,80}(mel|"
                    r"frames?|time|channels?|ax[ie]s|bins?)|(mel|frames?|time|channels?|ax[ie]s|bins?).{0,80}(scrambl|interleav)",
      paraphrases=("forward() uses feats.view(B, 26, -1) to get (batch, mels, frames); a view does not swap axes, it "
                   "reinterprets memory, so use feats.transpose(1, 2) instead.",
                   "The Conv1d input is a reshape rather than a permute of (batch, frames, mels): mel bins end up "
                   "interleaved along the time axis."))
def keyword_view_not_transpose(fixed: bool = False) -> dict:
    seed(0)
    x, y = _keywords(1600, 4)
    (xt, yt), (xv, yv) = split(x, y, 1300)
    model = KeywordCNN(transpose=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xt, yt), 32), val_loader=loader(TensorDataset(xv, yv), 100, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("shapes_keyword_view_not_transpose", fixed_of(keyword_view_not_transpose),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# 5. Character LM: BPTT chunks are transposed to batch-first for the GRU but the targets stay (seq, batch).

LM_VOCAB, BPTT, LM_BATCH = 16, 20, 32


def _stream(n_seq: int, s: int) -> torch.Tensor:
    g = gen(s)
    start = torch.randint(0, LM_VOCAB, (n_seq, 1), generator=g)
    step = torch.randint(1, 4, (n_seq, 1), generator=g)
    return ((start + step * torch.arange(12)) % LM_VOCAB).reshape(-1)


class BpttChunks(Dataset):
    """torchtext-style language-model data: the stream batchified into LM_BATCH columns (seq-first), cut into BPTT
    chunks; items are whole batches (DataLoader(batch_size=None))."""

    def __init__(self, stream: torch.Tensor, transpose_targets: bool):
        n = stream.numel() // LM_BATCH
        self.data = stream[: n * LM_BATCH].view(LM_BATCH, n).t().contiguous()   # (n, batch)
        self.starts = list(range(0, n - 1 - BPTT, BPTT))
        self.transpose_targets = transpose_targets

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, i):
        s = self.starts[i]
        x, y = self.data[s:s + BPTT], self.data[s + 1:s + 1 + BPTT]            # (bptt, batch) each
        return x.t().contiguous(), (y.t().contiguous() if self.transpose_targets else y)


class CharGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(LM_VOCAB, 32)
        self.gru = nn.GRU(32, 64, batch_first=True)
        self.out = nn.Linear(64, LM_VOCAB)

    def forward(self, x):                            # (batch, bptt)
        h, _ = self.gru(self.emb(x))
        return self.out(h)                           # (batch, bptt, vocab)


def lm_loss(model, batch):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, LM_VOCAB), y.reshape(-1))


def _lm_batches(fixed: bool, s: int, n_seq: int):
    ds = BpttChunks(_stream(n_seq, s), transpose_targets=fixed)
    return DataLoader(ds, batch_size=None, shuffle=True, generator=torch.Generator().manual_seed(1234))


@case("shapes_charlm_targets_seq_first", "shapes",
      bug="The BPTT inputs are transposed to (batch, seq) for the batch-first GRU but the targets stay (seq, batch), so "
          "after .reshape(-1) the flattened logits and targets are paired in different orders and each position is "
          "trained on another sequence's next character.",
      fix_line="Transpose the targets too: y = y.t().contiguous() in the dataset (same layout as the logits).",
      source="https://github.com/pytorch/text/pull/462",
      cause_pattern=r"(targets?|labels?|\by\b)\s.{0,100}(seq(uence)?[- ]first|\(\s*(seq|bptt|T)\w*\s*,\s*(batch|B)\w*\s*\)|"
                    r"not (been )?transposed|transpos)|transpos\w*.{0,60}(targets?|labels?)|"
                    r"(targets?|labels?).{0,80}(misalign|out of order|(do not|don't) line up|different order)|"
                    r"flatten\w*.{0,100}(different|mismatch\w*|inconsistent) order",
      paraphrases=("The targets are laid out (seq, batch) while the logits are (batch, seq, vocab); flattening both "
                   "pairs each logit with the wrong target. Transpose y before the loss.",
                   "Logits and labels are misaligned: y was not transposed when the inputs were made batch-first."))
def charlm_targets_seq_first(fixed: bool = False) -> dict:
    seed(0)
    model = CharGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=_lm_batches(fixed, 5, 1200), val_loader=_lm_batches(fixed, 6, 300),
                loss_fn=lm_loss, max_steps=2000, clip_grad_norm=0.5)


def _lm_fwd(m, b):
    x, y = b
    y = y if y.shape == x.shape else y.t()           # score against the true next character either way
    return m(x).argmax(-1).reshape(-1), y.reshape(-1)


fix("shapes_charlm_targets_seq_first", fixed_of(charlm_targets_seq_first), acc_of(_lm_fwd),
    "val next-character accuracy", steps=250)
