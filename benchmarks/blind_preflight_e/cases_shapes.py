"""Set e, family 1: shapes, broadcasting and axes at the loss or in the model."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_e.registry import case, loader, seed

FAMILY = "shapes"


# --------------------------------------------------------------------------- data


def gestures(n: int, T: int = 20, feats: int = 6, classes: int = 4, s: int = 0):
    """Accelerometer-like windows: each class is a frequency on its own axis pair, plus noise."""
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, classes, (n,), generator=g)
    t = torch.arange(T).float()
    phase = torch.rand(n, 1, generator=g) * 2 * math.pi
    freq = (1 + y.float()).unsqueeze(1) * 2 * math.pi / T
    wave = torch.sin(freq * t + phase)                       # (n, T)
    x = 0.3 * torch.randn(n, T, feats, generator=g)
    x[:, :, 0] += wave
    x[:, :, 1] += torch.cos(freq * t + phase)
    return x, y


def keyword_sequences(n: int, T: int = 24, vocab: int = 40, keyword: int = 7, s: int = 0, twice: bool = False):
    """[CLS]=1, then 3..T-1 real tokens (ids 8..vocab-1), 0-padded. Label 1: the keyword was inserted at a random real
    position (twice=False), or inserted twice rather than once (twice=True)."""
    g = torch.Generator().manual_seed(s)
    lengths = torch.randint(4, T + 1, (n,), generator=g)
    ids = torch.zeros(n, T, dtype=torch.long)
    y = torch.randint(0, 2, (n,), generator=g)
    for i in range(n):
        L = int(lengths[i])
        toks = torch.randint(8, vocab, (L,), generator=g)
        toks[0] = 1
        k = (1 + int(y[i])) if twice else int(y[i])
        toks[1 + torch.randperm(L - 1, generator=g)[:k]] = keyword
        ids[i, :L] = toks
    return ids, y


# --------------------------------------------------------------------------- 1. LSTM output viewed, not transposed


class GestureLSTM(nn.Module):
    """Time-major LSTM (the classic tutorial layout); the head reads every time step's state."""

    def __init__(self, feats=6, hidden=24, T=20, classes=4):
        super().__init__()
        self.lstm = nn.LSTM(feats, hidden)          # batch_first=False: expects (T, B, F)
        self.head = nn.Linear(T * hidden, classes)

    def forward(self, x):                            # x: (B, T, F) from the DataLoader
        out, _ = self.lstm(x.transpose(0, 1))        # (T, B, H)
        return self.head(out.reshape(x.size(0), -1))  # BUG: (T, B, H) flattened as if it were (B, T, H)


@case("gesture_lstm_time_major_output_reshaped", FAMILY,
      "the time-major LSTM output (T,B,H) is flattened with out.reshape(B, -1) as if it were (B,T,H): each row the "
      "head reads is a block of consecutive (time, sample) states, i.e. the states of several different gestures "
      "of the batch, so every prediction mixes samples (out.transpose(0, 1).reshape(B, -1) is the fix)",
      r"(samples?|examples?|rows?|gestures?)[^.]*(mix|leak|depend on|interact)|mix(es|ing|ed)?[^.]*(samples|examples|"
      r"batch)|across (the )?(batch|samples|examples)|batch (axis|dim)|transpos|permut|time.?major|batch.?first")
def gesture_lstm_time_major_output_reshaped():
    seed(0)
    x, y = gestures(3000, s=1)
    model = GestureLSTM()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 2. InfoNCE embeddings normalised over the batch


class PairEncoder(nn.Module):
    def __init__(self, d_in=32, d=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, 64), nn.ReLU(), nn.Linear(64, d))

    def forward(self, x):
        return self.net(x)


def noisy_views(n_items: int = 4096, d: int = 32, noise: float = 0.5, s: int = 0):
    g = torch.Generator().manual_seed(s)
    base = torch.randn(n_items, d, generator=g)
    a = base + noise * torch.randn(n_items, d, generator=g)
    b = base + noise * torch.randn(n_items, d, generator=g)
    return a, b


def infonce_dim0(model, batch):
    a, b = batch
    za = F.normalize(model(a), dim=0)    # BUG: unit-normalises each feature column over the batch, not each row
    zb = F.normalize(model(b), dim=0)
    logits = za @ zb.t() / 0.1
    return F.cross_entropy(logits, torch.arange(a.size(0)))


@case("query_doc_infonce_normalize_over_batch", FAMILY,
      "the InfoNCE loss calls F.normalize(z, dim=0) on (B,D) embeddings: every feature column is scaled to unit norm "
      "across the batch instead of every embedding to unit length, so the 'cosine' logits are not cosines and each "
      "item's embedding depends on the other items of its batch (dim=1 / dim=-1 is the fix)",
      r"normali[sz]\w*[^.]*(dim|axis|batch|row|column)|(dim|axis)[^.]*normali[sz]|unit (norm|length)|(norm|length) "
      r"of (each|every)|across (the )?batch|(samples?|examples?|items?)[^.]*(depend on|mix)|batch (axis|dim)")
def query_doc_infonce_normalize_over_batch():
    seed(0)
    a, b = noisy_views(s=2)
    model = PairEncoder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(a, b), 64, drop_last=True), loss_fn=infonce_dim0, max_steps=2000)


# --------------------------------------------------------------------------- 3. per-sample attention mask in head-major order


class KeywordSpotter(nn.Module):
    """Does the command word occur twice? One pre-built 3-D attention mask per sample (key padding for every
    query), a [CLS] read-out."""

    def __init__(self, vocab=40, d=32, heads=4, T=24):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.pos = nn.Embedding(T, d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 2)

    def forward(self, ids):
        B, T = ids.shape
        pad = ids == 0                                        # (B, T) True on padding
        mask = pad[:, None, :].expand(B, T, T)                # (B, T_query, T_key)
        mask = mask.repeat(self.heads, 1, 1)                  # BUG: head-major; MHA wants index b*heads + h
        h = self.embed(ids) + self.pos(torch.arange(T))
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        return self.head(self.norm(h + a)[:, 0])              # the [CLS] position


@case("keyword_attention_mask_repeat_not_interleave", FAMILY,
      "the per-sample (B,T,T) padding mask is expanded to (B*heads,T,T) with mask.repeat(heads,1,1), which is "
      "head-major, while nn.MultiheadAttention reads index b*heads+h: most heads of sample b get the padding mask "
      "of another sample of the batch, so real tokens are masked and padding is attended (repeat_interleave(heads, "
      "0) or key_padding_mask is the fix)",
      r"repeat_interleave|key_padding_mask|mask[^.]*(other|another|wrong|different|misalign|permut|mismatch)[^.]*("
      r"samples?|examples?|sequences?|rows?|batch)|(samples?|examples?|sequences?)[^.]*(other|another|wrong|"
      r"different)[^.]*mask|head.?major|batch.?major")
def keyword_attention_mask_repeat_not_interleave():
    seed(0)
    ids, y = keyword_sequences(3000, s=3, twice=True)
    model = KeywordSpotter()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:2560], y[:2560]), 32),
                val_loader=loader(TensorDataset(ids[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 4. tags flattened time-major, logits batch-major


def tagging_corpus(n: int, T: int = 16, vocab: int = 60, tags: int = 5, s: int = 0):
    """A tag depends on the word (its id modulo 5) and on whether the previous word is a 'determiner' (id < 12)."""
    g = torch.Generator().manual_seed(s)
    ids = torch.randint(2, vocab, (n, T), generator=g)
    prev_det = torch.cat([torch.zeros(n, 1, dtype=torch.bool), ids[:, :-1] < 12], 1)
    tag = (ids % 4) + prev_det.long()
    return ids, tag.clamp(max=tags - 1)


def time_major_collate(batch):
    """torchtext-style batches: (T, B) text and (T, B) tags."""
    ids = torch.stack([b[0] for b in batch], 1)
    tags = torch.stack([b[1] for b in batch], 1)
    return ids, tags


class BiGRUTagger(nn.Module):
    def __init__(self, vocab=60, d=32, tags=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.gru = nn.GRU(d, d, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * d, tags)

    def forward(self, ids):              # (B, T)
        h, _ = self.gru(self.embed(ids))
        return self.out(h)               # (B, T, tags)


def tagger_loss(model, batch):
    text, tags = batch                   # both (T, B)
    logits = model(text.t())             # the model is batch_first: (B, T, C)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tags.reshape(-1))   # BUG: tags still (T, B)


@case("pos_tagger_time_major_tags_vs_batch_major_logits", FAMILY,
      "the loader serves time-major (T,B) text and tags; the loss transposes the text for the batch_first tagger "
      "but flattens the tags as they are, so logits.reshape(-1,C) is in (sample, position) order and tags.reshape(-1) "
      "in (position, sample) order: almost every prediction is scored against another token's tag",
      r"(align|order|layout|transpos|time.?major|batch.?major)[^.]*(tags?|labels?|targets?)|(tags?|labels?|targets?)"
      r"[^.]*(align|order|layout|transpos|time.?major|batch.?major)|\(T, ?B\)")
def pos_tagger_time_major_tags_vs_batch_major_logits():
    seed(0)
    ids, tags = tagging_corpus(3000, s=4)
    model = BiGRUTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids[:2560], tags[:2560]), 32, collate_fn=time_major_collate),
                val_loader=loader(TensorDataset(ids[2560:], tags[2560:]), 128, shuffle=False,
                                  collate_fn=time_major_collate),
                loss_fn=tagger_loss, max_steps=2000)


# --------------------------------------------------------------------------- 5. global average pool over NHWC axes


def bar_orientations(n: int, size: int = 16, s: int = 0):
    """3-channel images with one bar (horizontal, vertical, diagonal, anti-diagonal) at a random position."""
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.2 * torch.randn(n, 3, size, size, generator=g)
    for i in range(n):
        r, c = (int(v) for v in torch.randint(3, size - 3, (2,), generator=g))
        for k in range(-2, 3):
            rr, cc = {0: (r, c + k), 1: (r + k, c), 2: (r + k, c + k), 3: (r + k, c - k)}[int(y[i])]
            x[i, :, rr, cc] += 1.0
    return x, y


class BarCNN(nn.Module):
    def __init__(self, width=16, classes=4):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = self.features(x)             # (B, C=16, H=16, W=16)
        h = h.mean(dim=(1, 2))           # BUG: Keras-style GlobalAveragePooling axes (1, 2) on an NCHW tensor
        return self.head(h)              # (B, W) happens to have 16 = C columns, so the shapes line up


@case("bar_cnn_global_pool_over_channels_and_height", FAMILY,
      "the 'global average pool' is h.mean(dim=(1, 2)), the NHWC axes of Keras' GlobalAveragePooling2D, on an NCHW "
      "(B,16,16,16) tensor: it averages away the 16 channels and the height and keeps the width axis, which has the "
      "same size as the channel count, so the head reads one position-dependent number per image column instead of "
      "16 features (mean(dim=(2, 3)) is the fix)",
      r"(mean|pool|pooling|average|reduc)\w*[^.]*(axis|axes|dim|channel|spatial|width)|(axis|axes|dim)[^.]*(mean|pool|"
      r"average)|channels?.last|NHWC|NCHW")
def bar_cnn_global_pool_over_channels_and_height():
    seed(0)
    x, y = bar_orientations(2500, s=5)
    model = BarCNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2048], y[:2048]), 64),
                val_loader=loader(TensorDataset(x[2048:], y[2048:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 6. NHWC images transposed (1, 3), masks not


def road_marking_scenes(n: int, size: int = 16, s: int = 0):
    """NHWC float images with red horizontal markings (2 x 7 pixels) and their (H, W) masks, as stored on disk."""
    g = torch.Generator().manual_seed(s)
    imgs = 0.15 * torch.rand(n, size, size, 3, generator=g)
    masks = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        for _ in range(2):
            r = int(torch.randint(0, size - 2, (1,), generator=g))
            c = int(torch.randint(0, size - 7, (1,), generator=g))
            imgs[i, r:r + 2, c:c + 7, 0] += 0.8
            masks[i, r:r + 2, c:c + 7] = 1
    return imgs, masks


def nhwc_collate(batch):
    imgs = torch.stack([b[0] for b in batch]).transpose(1, 3)   # BUG: (B,H,W,C) -> (B,C,W,H), not (B,C,H,W)
    masks = torch.stack([b[1] for b in batch])                  # (B, H, W)
    return imgs, masks


def small_fcn(classes=2, width=16):
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1),
                         nn.ReLU(), nn.Conv2d(width, classes, 1))


@case("marking_segmentation_image_transposed_mask_not", FAMILY,
      "the collate turns the NHWC images into channels-first with transpose(1, 3), which gives (B,C,W,H), while the "
      "masks stay (B,H,W): the images are square so every shape matches, but each predicted pixel (w,h) is scored "
      "against the mask at (h,w), i.e. horizontal markings are labelled as vertical ones (permute(0, 3, 1, 2) is "
      "the fix)",
      r"transpos|permut|swap|(height|\bH\b)[^.]*(width|\bW\b)|(width|\bW\b)[^.]*(height|\bH\b)|orient|(masks?|targets?|"
      r"labels?)[^.]*(misalign|not aligned|mismatch|transposed|rotat|flip)|NHWC|channels?.last|spatial(ly)? "
      r"(misalign|mismatch)")
def marking_segmentation_image_transposed_mask_not():
    seed(0)
    imgs, masks = road_marking_scenes(1200, s=6)
    model = small_fcn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(imgs[:1024], masks[:1024]), 32, collate_fn=nhwc_collate),
                val_loader=loader(TensorDataset(imgs[1024:], masks[1024:]), 64, shuffle=False, collate_fn=nhwc_collate),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


# --------------------------------------------------------------------------- 7. triplet embeddings chunked along features


def product_triplets(n: int = 4096, items: int = 256, d: int = 32, s: int = 0):
    """Product photos' feature vectors: 8 dims identify the item, 24 dims are heavy nuisance (pose, lighting)."""
    g = torch.Generator().manual_seed(s)
    base = torch.randn(items, 8, generator=g)
    i = torch.randint(0, items, (n,), generator=g)
    j = (i + torch.randint(1, items, (n,), generator=g)) % items

    def view(idx):
        return torch.cat([base[idx] + 0.2 * torch.randn(len(idx), 8, generator=g),
                          3.0 * torch.randn(len(idx), d - 8, generator=g)], 1)
    return view(i), view(i), view(j), base


class ProductEmbedder(nn.Module):
    def __init__(self, d_in=32, d=48):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, 128), nn.ReLU(), nn.Linear(128, d))

    def forward(self, x):
        return self.net(x)


_triplet = nn.TripletMarginLoss(margin=0.5)


def triplet_chunk_loss(model, batch):
    anchor, positive, negative = batch
    emb = model(torch.cat([anchor, positive, negative]))      # (3B, D): one forward for the three roles
    ea, ep, en = emb.chunk(3, dim=-1)                         # BUG: splits the embedding dims, not the 3B rows
    return _triplet(ea, ep, en)


@case("product_triplet_embeddings_chunked_on_feature_dim", FAMILY,
      "the anchor, positive and negative rows are concatenated into one (3B,D) forward and split back with "
      "emb.chunk(3, dim=-1): the split is along the embedding dimension, so 'anchor', 'positive' and 'negative' "
      "are three slices of the same rows' embeddings, the triplet loss is solved by the slices alone and the "
      "items are never compared (chunk(3, dim=0) is the fix)",
      r"chunk|split|slices?|(same|identical) (rows?|samples?|items?|examples?)|(feature|embedding) (dim|axis)|(dim|"
      r"axis)[^.]*(0|batch|feature|embedding)")
def product_triplet_embeddings_chunked_on_feature_dim():
    seed(0)
    a, p, n, _ = product_triplets(s=7)
    model = ProductEmbedder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(a, p, n), 64), loss_fn=triplet_chunk_loss, max_steps=2000)
