"""Set f, family `shapes`: shape / axis / broadcast / layout bugs at the model or the loss."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_f.registry import case, loader, seed, token_sequences

# --------------------------------------------------------------------------- 1: a hand-written GPT


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q = q.view(B, T, self.heads, D // self.heads)
        k = k.view(B, T, self.heads, D // self.heads)
        v = v.view(B, T, self.heads, D // self.heads)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.reshape(B, T, D))


class GPTBlock(nn.Module):
    def __init__(self, d, heads, attention=CausalSelfAttention):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = attention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=32, d=32, heads=4, T=32, layers=2, attention=CausalSelfAttention):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(T, d)
        self.blocks = nn.Sequential(*[GPTBlock(d, heads, attention) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        h = self.tok(ids) + self.pos(torch.arange(ids.size(1)))
        return self.head(self.ln(self.blocks(h)))


def next_token_loss(model, batch):
    ids = batch[0]
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))


def progressions(n=1280, length=24, vocab=32, s=0):
    return token_sequences(n, length, vocab, s=s)


@case("char_lm_attention_heads_not_transposed", "shapes",
      "the hand-written causal self-attention splits q, k, v into heads with view(B, T, heads, d_head) and hands them "
      "to scaled_dot_product_attention without .transpose(1, 2): SDPA reads (batch, 'heads', 'sequence', d), so each "
      "position attends across its own 4 head slices and never to another position; the LM has no context and "
      "cannot learn the progressions' step (transpose to (B, heads, T, d_head) is the fix)",
      r"transpos|(heads?)[^.]*(axis|dim|layout|split)|(attend|attention)\w*[^.]*(across (the )?heads|within (each|a single|one|its own) (position|token))|(positions?|tokens?)[^.]*(never|do not|don't|cannot|can't) (attend|see|interact|mix)|(no|without) (context|cross.?(position|token))|\(B, ?T, ?(H|heads)")
def char_lm_attention_heads_not_transposed():
    seed(0)
    seq = progressions(s=1)
    model = TinyGPT()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(seq[:1024]), 32),
                val_loader=loader(TensorDataset(seq[1024:]), 64, shuffle=False),
                loss_fn=next_token_loss, max_steps=2000)


# --------------------------------------------------------------------------- 2: BiLSTM tagger, logits to (B, C, T)


def tagged_sentences(n=2000, T=16, vocab=40, tags=6, s=0):
    g = torch.Generator().manual_seed(s)
    ids = torch.randint(2, vocab, (n, T), generator=g)
    table = torch.randint(0, tags, (vocab,), generator=g)
    ambiguous = torch.zeros(vocab, dtype=torch.bool)
    ambiguous[2:8] = True
    y = table[ids]
    prev = torch.cat([torch.zeros(n, 1, dtype=torch.long), ids[:, :-1]], 1)
    y = torch.where(ambiguous[ids], (prev % 2) * 2, y)          # these words are tagged from their left neighbour
    return ids, y


class BiLSTMTagger(nn.Module):
    def __init__(self, vocab=40, d=32, tags=6):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, d, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * d, tags)

    def forward(self, ids):
        return self.out(self.lstm(self.embed(ids))[0])        # (B, T, tags)


def tagger_loss(model, batch):
    ids, tags = batch
    logits = model(ids)
    return F.cross_entropy(logits.reshape(tags.size(0), -1, tags.size(1)), tags)


@case("pos_tagger_logits_reshaped_to_bct", "shapes",
      "cross_entropy wants (N, C, T) logits for (N, T) tags and the (B, T, C) tagger output is brought there with "
      "logits.reshape(B, -1, T) instead of logits.transpose(1, 2) / permute(0, 2, 1): the shapes match, but the "
      "'class scores' of position t are now a scramble of other positions' outputs, so each token is scored with "
      "numbers that mostly belong to other tokens and other tags",
      r"transpos|permut|(reshape|view)\w*[^.]*(logits|class|layout|order|axis|dim)|(layout|order)[^.]*(logits|class(es)? (dim|axis))|(class|classes|tags?) (dim|axis)|(dim|axis)[^.]*(class|tags?)|\(B, ?C, ?T\)|\(B, ?T, ?C\)")
def pos_tagger_logits_reshaped_to_bct():
    seed(0)
    ids, tags = tagged_sentences(s=2)
    model = BiLSTMTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids[:1600], tags[:1600]), 32),
                val_loader=loader(TensorDataset(ids[1600:], tags[1600:]), 100, shuffle=False),
                loss_fn=tagger_loss, max_steps=2000)


# --------------------------------------------------------------------------- 3: HF-style attention_mask as key_padding_mask


CLS, PAD, KEYWORD = 1, 0, 7


def cls_keyword_batches(n=2400, T=24, vocab=40, s=0):
    g = torch.Generator().manual_seed(s)
    ids = torch.randint(8, vocab, (n, T), generator=g)
    lengths = torch.randint(6, T - 2, (n,), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    pos = (torch.rand(n, generator=g) * (lengths - 1).float()).long() + 1
    ids[y == 1, pos[y == 1]] = KEYWORD
    ids[:, 0] = CLS
    att = (torch.arange(T)[None, :] < lengths[:, None]).long()
    ids = ids * att
    return ids, att, y


class ClsTransformer(nn.Module):
    def __init__(self, vocab=40, d=32, T=24):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=PAD)
        self.pos = nn.Embedding(T, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 2)

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids) + self.pos(torch.arange(input_ids.size(1)))
        h = self.encoder(h, src_key_padding_mask=attention_mask.bool())
        return self.head(h[:, 0])


def cls_loss(model, batch):
    ids, att, y = batch
    return F.cross_entropy(model(ids, att), y)


@case("ticket_transformer_attention_mask_as_key_padding_mask", "shapes",
      "the Hugging Face-style attention_mask (1 = real token, 0 = padding) is passed straight as nn.TransformerEncoder's "
      "src_key_padding_mask, whose True means 'ignore this key': every real token is hidden and only the padding is "
      "attended, so the [CLS] read-out never sees the ticket's words (attention_mask == 0 is the mask to pass)",
      r"key_padding_mask|(mask)[^.]*(invert|revers|flip|opposite|backwards|complement|meaning|convention|semantic)|(attend\w*|attention)[^.]*(only|just)[^.]*(pad|padding)|(real|non.?pad\w*|actual) tokens?[^.]*(masked|ignored|hidden|excluded)|True (means|=) (ignore|masked|pad)|attention_mask ?== ?0|~ ?attention_mask|logical_not")
def ticket_transformer_attention_mask_as_key_padding_mask():
    seed(0)
    ids, att, y = cls_keyword_batches(s=3)
    model = ClsTransformer()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:2000], att[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(ids[2000:], att[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=cls_loss, max_steps=2000)


# --------------------------------------------------------------------------- 4: spectrogram (B, T, F) viewed as (B, F, T)


def band_bursts(n=2400, T=32, Fq=16, s=0):
    """Noisy log-mel-like frames (B, T, F); class k: a burst in frequency band k at a random time."""
    g = torch.Generator().manual_seed(s)
    x = 0.3 * torch.randn(n, T, Fq, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    t0 = torch.randint(0, T - 6, (n,), generator=g)
    for i in range(n):
        x[i, t0[i]:t0[i] + 6, 4 * y[i]:4 * y[i] + 4] += 1.5
    return x, y


class FrameConvNet(nn.Module):
    def __init__(self, n_mels=16, c=32, classes=4):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(n_mels, c, 3, padding=1), nn.ReLU(), nn.Conv1d(c, c, 3, padding=1),
                                  nn.ReLU(), nn.AdaptiveMaxPool1d(1), nn.Flatten())
        self.head = nn.Linear(c, classes)

    def forward(self, frames):                       # frames: (B, T, n_mels)
        x = frames.view(frames.size(0), frames.size(2), frames.size(1))
        return self.head(self.conv(x))


@case("keyword_conv1d_frames_viewed_as_channels_first", "shapes",
      "the (B, T, n_mels) log-mel frames are turned into Conv1d's (B, channels, length) with frames.view(B, n_mels, T) "
      "instead of frames.transpose(1, 2): view keeps the memory order, so each 'mel channel' holds two consecutive "
      "frames' spectra and the conv slides along frequency; after the global max-pool the band that defines the class is "
      "gone and the net cannot tell the keywords apart",
      r"transpos|permut|\bview\b|reshape|(channels?|time|frequency|mel)[^.]*(axis|dim|layout|order|swap|scrambl|mix)|(axis|dim|layout)[^.]*(channels?|time|frequency|mel)|channels?.(first|last)|\(B, ?T, ?F\)|\(B, ?F, ?T\)")
def keyword_conv1d_frames_viewed_as_channels_first():
    seed(0)
    x, y = band_bursts(s=4)
    model = FrameConvNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 5: VAE KL reduced over the batch axis


def manifold_vectors(n=3000, d=16, s=0):
    g = torch.Generator().manual_seed(s)
    z = torch.randn(n, 2, generator=g)
    A = torch.randn(2, d, generator=g)
    return torch.tanh(z @ A) + 0.05 * torch.randn(n, d, generator=g)


class VAE(nn.Module):
    def __init__(self, d=16, latent=4, hidden=64):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, 2 * latent))
        self.dec = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, d))

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, dim=-1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.dec(z), mu, logvar


def vae_loss(model, batch):
    x = batch[0]
    recon, mu, logvar = model(x)
    rec = F.mse_loss(recon, x, reduction="none").sum(dim=1).mean()
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp(), dim=0).mean()
    return rec + kl


@case("sensor_vae_kl_summed_over_batch_axis", "shapes",
      "the VAE's KL term is torch.sum(..., dim=0).mean(): summed over the 128 samples of the batch and averaged over "
      "the 4 latent dims, while the reconstruction is summed over features and averaged over samples; the KL is "
      "weighted 32x (batch / latent) against the data term, the posterior collapses to the prior and the decoder "
      "outputs the mean vector (sum over dim=1, mean over the batch is the fix)",
      r"\bKL\b|kullback|posterior collapse|(sum|summed|reduc\w*)[^.]*(batch (axis|dim)|dim\s*=\s*0|over the batch|across the batch|over (the )?samples)|(batch (size|axis|dim))[^.]*(scal|weight|KL)")
def sensor_vae_kl_summed_over_batch_axis():
    seed(0)
    x = manifold_vectors(s=5)
    model = VAE()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2560]), 128),
                val_loader=loader(TensorDataset(x[2560:]), 220, shuffle=False),
                loss_fn=vae_loss, max_steps=2000)


# --------------------------------------------------------------------------- 6: tutorial positional encoding, batch_first


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[:x.size(0)]


def order_pairs(n=3000, T=16, vocab=30, s=0):
    """Label: does the alarm token (1) occur in the first half of the session?"""
    g = torch.Generator().manual_seed(s)
    ids = torch.randint(3, vocab, (n, T), generator=g)
    pa = torch.randint(0, T, (n,), generator=g)
    ids[torch.arange(n), pa] = 1
    return ids, (pa < T // 2).long()


class OrderTransformer(nn.Module):
    def __init__(self, vocab=30, d=32, positional=PositionalEncoding):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = positional(d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 2)

    def forward(self, ids):
        h = self.pos(self.embed(ids))
        return self.head(self.encoder(h).mean(dim=1))


@case("event_order_transformer_positional_encoding_on_batch_axis", "shapes",
      "the PyTorch tutorial's PositionalEncoding (pe of shape (max_len, 1, d), x + pe[:x.size(0)]) is used in a "
      "batch_first model: x.size(0) is the batch, so sample b gets the encoding of position b added to all its tokens "
      "and no token gets its own position; the encoder is order-blind and cannot tell whether the alarm came early",
      r"position\w*[^.]*(batch|sample|order|encoding|embedding|index|information)|(batch|sample)[^.]*position|order.?(blind|invariant|information)|permutation.?invariant|pe\[|batch.first")
def event_order_transformer_positional_encoding_on_batch_axis():
    seed(0)
    ids, y = order_pairs(s=6)
    model = OrderTransformer()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(ids[:2560], y[:2560]), 32),
                val_loader=loader(TensorDataset(ids[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 7: contrastive loss, distance over the batch


def writer_pairs(n=3000, d=32, writers=60, s=0):
    g = torch.Generator().manual_seed(s)
    protos = torch.randn(writers, d, generator=g)
    wa = torch.randint(0, writers, (n,), generator=g)
    same = torch.rand(n, generator=g) < 0.5
    wb = torch.where(same, wa, (wa + torch.randint(1, writers, (n,), generator=g)) % writers)
    noise = lambda: 0.9 * torch.randn(n, d, generator=g)  # noqa: E731
    return protos[wa] + noise(), protos[wb] + noise(), same.float()


class SignatureEncoder(nn.Module):
    def __init__(self, d=32, out=16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, out))

    def forward(self, x):
        return self.net(x)


def contrastive_loss(model, batch, margin=2.0):
    a, b, same = batch
    dist = (model(a) - model(b)).pow(2).sum().sqrt()
    return (same * dist.pow(2) + (1 - same) * F.relu(margin - dist).pow(2)).mean()


@case("signature_siamese_distance_summed_over_batch", "shapes",
      "the contrastive loss computes the pair distance as (za - zb).pow(2).sum().sqrt() with no dim: one scalar, the "
      "distance between the whole batches, broadcast against the (B,) same/different labels; every pair gets the same "
      "distance and the same gradient, so same-writer and different-writer pairs are never told apart (sum(dim=1) is "
      "the fix)",
      r"(sum|reduc\w*|distance|norm)[^.]*(whole|entire|all|across the|over the) (batch|pairs|samples)|sum\(dim ?= ?(1|-1)\)|\.sum\((1|-1)\)|per.?(pair|sample|example)|scalar (distance|norm)|(no|without) (a )?dim|(distance|loss)[^.]*(same|identical|shared) (for|across) (every|all)")
def signature_siamese_distance_summed_over_batch():
    seed(0)
    a, b, same = writer_pairs(s=7)
    model = SignatureEncoder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(a[:2560], b[:2560], same[:2560]), 64),
                val_loader=loader(TensorDataset(a[2560:], b[2560:], same[2560:]), 110, shuffle=False),
                loss_fn=contrastive_loss, max_steps=2000)
