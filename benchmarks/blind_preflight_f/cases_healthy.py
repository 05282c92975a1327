"""Set f: healthy recipes (no bug). Several are the correct twin of a broken case of this set."""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_f.cases_data import RoomWindows, TicketRouter, room_windows, tickets
from benchmarks.blind_preflight_f.cases_shapes import (
    ClsTransformer,
    FrameConvNet,
    OrderTransformer,
    PositionalEncoding,
    SignatureEncoder,
    TinyGPT,
    band_bursts,
    cls_keyword_batches,
    next_token_loss,
    order_pairs,
    progressions,
    writer_pairs,
)
from benchmarks.blind_preflight_f.cases_targets import DictDataset, counting_up_sequences, tiny_gpt2
from benchmarks.blind_preflight_f.cases_trained import (
    LinearProbe,
    bar_images,
    first_token_sequences,
    pretrained_checkpoint,
    probe_task,
)
from benchmarks.blind_preflight_f.registry import healthy, loader, seed, teacher_classes

# --------------------------------------------------------------------------- 1


class HeadsAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in self.qkv(x).split(D, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


@healthy("char_lm_attention_heads_transposed",
         "a hand-written 2-layer GPT: q, k, v split with view(B, T, heads, d_head).transpose(1, 2) into SDPA with "
         "is_causal=True and merged back with transpose(1, 2).reshape(B, T, D); next-token CE on progressions")
def char_lm_attention_heads_transposed():
    seed(0)
    seq = progressions(s=51)
    model = TinyGPT(attention=HeadsAttention)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(seq[:1024]), 32),
                val_loader=loader(TensorDataset(seq[1024:]), 64, shuffle=False),
                loss_fn=next_token_loss, max_steps=2000)


# --------------------------------------------------------------------------- 2


class ClsTransformerMasked(ClsTransformer):
    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids) + self.pos(torch.arange(input_ids.size(1)))
        h = self.encoder(h, src_key_padding_mask=attention_mask == 0)
        return self.head(h[:, 0])


def cls_loss(model, batch):
    ids, att, y = batch
    return F.cross_entropy(model(ids, att), y)


@healthy("ticket_transformer_key_padding_mask_from_attention_mask_eq_0",
         "a pre-norm batch_first TransformerEncoder over right-padded tickets with src_key_padding_mask = "
         "(attention_mask == 0) (True on the padding), a [CLS] read-out at position 0, CE on 2 classes")
def ticket_transformer_key_padding_mask_from_attention_mask_eq_0():
    seed(0)
    ids, att, y = cls_keyword_batches(s=52)
    model = ClsTransformerMasked()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:2000], att[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(ids[2000:], att[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=cls_loss, max_steps=2000)


# --------------------------------------------------------------------------- 3


class BatchFirstPositionalEncoding(PositionalEncoding):
    def __init__(self, d_model, max_len=5000):
        super().__init__(d_model, max_len)
        self.pe = self.pe.transpose(0, 1).contiguous()         # (1, max_len, d)

    def forward(self, x):
        return x + self.pe[:, :x.size(1)]


@healthy("event_order_transformer_batch_first_positional_encoding",
         "sinusoidal positions stored as (1, max_len, d) and added as x + pe[:, :T] to batch_first (B, T, d) "
         "embeddings; a TransformerEncoder decides whether the alarm token occurs in the first half")
def event_order_transformer_batch_first_positional_encoding():
    seed(0)
    ids, y = order_pairs(s=53)
    model = OrderTransformer(positional=BatchFirstPositionalEncoding)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(ids[:2560], y[:2560]), 32),
                val_loader=loader(TensorDataset(ids[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 4


@healthy("gpt2_separate_pad_token_eos_kept_in_labels",
         "GPT2LMHeadModel from a tiny config with its own pad id (0, not EOS): right-padded sequences that end in EOS, "
         "labels = input_ids with -100 where attention_mask == 0, so every EOS stays a target")
def gpt2_separate_pad_token_eos_kept_in_labels():
    seed(0)
    ids, att = counting_up_sequences(s=54, pad_id=0)
    labels = ids.masked_fill(att == 0, -100)
    model = tiny_gpt2(pad_id=0)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(DictDataset(input_ids=ids[:1200], attention_mask=att[:1200], labels=labels[:1200]), 32),
                val_loader=loader(DictDataset(input_ids=ids[1200:], attention_mask=att[1200:], labels=labels[1200:]), 100,
                                  shuffle=False),
                loss_fn=None, max_steps=2000)


# --------------------------------------------------------------------------- 5


@healthy("ticket_router_vocab_ids_start_after_pad_and_unk",
         "support-ticket routing: vocabulary ids start at 2 (0 = [PAD], 1 = [UNK]), padding 0, Embedding(padding_idx=0) "
         "and masked mean pooling over ids != 0, an MLP head over 4 queues")
def ticket_router_vocab_ids_start_after_pad_and_unk():
    seed(0)
    texts, y = tickets(s=55)
    vocab = {w: i + 2 for i, w in enumerate(sorted({w for t in texts[:2560] for w in t.split()}))}
    rows = [[vocab.get(w, 1) for w in t.split()][:12] for t in texts]
    ids = torch.tensor([r + [0] * (12 - len(r)) for r in rows])
    model = TicketRouter(len(vocab) + 2)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(ids[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 6


class StepwiseGRUFull(nn.Module):
    def __init__(self, vocab=12, d=32, classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.cell = nn.GRUCell(d, d)
        self.head = nn.Linear(d, classes)

    def forward(self, ids):
        e = self.embed(ids)
        h = torch.zeros(ids.size(0), self.cell.hidden_size)
        for t in range(ids.size(1)):
            h = self.cell(e[:, t], h)
        return self.head(h)


@healthy("session_grucell_loop_full_backprop_through_time",
         "a hand-unrolled GRUCell over 12-step sessions, the hidden state carried without detaching inside the "
         "sequence (each batch starts from zeros), the class read from the final state")
def session_grucell_loop_full_backprop_through_time():
    seed(0)
    ids, y = first_token_sequences(s=56)
    model = StepwiseGRUFull()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(ids[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 7


@healthy("batchnorm_mlp_micro_batches_of_32_accumulated_2x",
         "a BatchNorm1d MLP on raw-scale tabular features, loader batches of 32 with accumulation_steps=2 (64 per "
         "optimizer step), Adam")
def batchnorm_mlp_micro_batches_of_32_accumulated_2x():
    seed(0)
    x, y = teacher_classes(3000, 16, 4, s=57)
    x = x * 3 + 1
    model = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64), nn.BatchNorm1d(64),
                          nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 32, drop_last=True),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), accumulation_steps=2, max_steps=2000)


# --------------------------------------------------------------------------- 8


class GlobalScaledWindows(RoomWindows):
    def __init__(self, windows, labels, mean, std):
        super().__init__(windows, labels)
        self.mean, self.std = mean, std

    def __getitem__(self, i):
        return ((self.windows[i] - self.mean) / self.std).flatten(), self.labels[i]


@healthy("room_sensor_windows_standardised_with_train_statistics",
         "temperature / humidity / CO2 windows standardised per channel with the training split's mean and std "
         "(flattened into an MLP); the overheating label is the temperature level")
def room_sensor_windows_standardised_with_train_statistics():
    seed(0)
    w, y = room_windows(s=58)
    mean, std = w[:2560].mean(dim=(0, 1)), w[:2560].std(dim=(0, 1))
    model = nn.Sequential(nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(GlobalScaledWindows(w[:2560], y[:2560], mean, std), 64),
                val_loader=loader(GlobalScaledWindows(w[2560:], y[2560:], mean, std), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 9


@healthy("linear_probe_checkpoint_prefix_stripped_strict",
         "a linear probe: the pretrained backbone's DataParallel checkpoint loaded with the 'module.' prefix stripped "
         "and strict=True, the backbone frozen on purpose (requires_grad_(False)), only the head in Adam")
def linear_probe_checkpoint_prefix_stripped_strict():
    seed(0)
    model = LinearProbe()
    state = {k.removeprefix("module."): v for k, v in pretrained_checkpoint().items()}
    model.backbone.load_state_dict(state, strict=True)
    model.backbone.requires_grad_(False)
    x, y = probe_task(s=59)
    return dict(model=model, optimizer=torch.optim.Adam(model.head.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 64),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 10


def reverse_pairs(n=1400, s=0, vocab=32):
    g = torch.Generator().manual_seed(s)
    T = 12
    src = torch.zeros(n, T, dtype=torch.long)
    labels = torch.full((n, T), -100, dtype=torch.long)
    for i in range(n):
        L = int(torch.randint(4, T - 1, (1,), generator=g))
        toks = torch.randint(3, vocab, (L,), generator=g)
        src[i, :L] = toks
        src[i, L] = 2
        labels[i, :L] = toks.flip(0)
        labels[i, L] = 2
    return src, (src != 0).long(), labels


@healthy("bart_tiny_reverse_from_config",
         "BartForConditionalGeneration from a tiny BartConfig (no download): source ids + EOS with attention_mask, "
         "labels = the reversed source + EOS, right-padded with -100 (the model builds decoder inputs from them); "
         "model(**batch).loss")
def bart_tiny_reverse_from_config():
    from transformers import BartConfig, BartForConditionalGeneration
    seed(0)
    src, att, labels = reverse_pairs(s=60)
    model = BartForConditionalGeneration(BartConfig(
        vocab_size=32, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
        dropout=0.0))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(DictDataset(input_ids=src[:1200], attention_mask=att[:1200], labels=labels[:1200]), 32),
                val_loader=loader(DictDataset(input_ids=src[1200:], attention_mask=att[1200:], labels=labels[1200:]), 100,
                                  shuffle=False),
                loss_fn=None, max_steps=2000)


# --------------------------------------------------------------------------- 11


class ChunkTags(Dataset):
    """Variable-length token sequences; tag = the token's class, flipped to 'B' after a marker token."""

    def __init__(self, n, s=0):
        g = torch.Generator().manual_seed(s)
        self.items = []
        for _ in range(n):
            L = int(torch.randint(4, 20, (1,), generator=g))
            ids = torch.randint(2, 30, (L,), generator=g)
            tags = (ids % 3)
            after_marker = torch.cumsum((ids == 2).long(), 0) > 0
            tags = torch.where(after_marker & (tags == 0), torch.full_like(tags, 3), tags)
            self.items.append((ids, tags))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def packed_collate(batch):
    ids = pad_sequence([b[0] for b in batch], batch_first=True, padding_value=0)
    tags = pad_sequence([b[1] for b in batch], batch_first=True, padding_value=-100)
    return ids, torch.tensor([len(b[0]) for b in batch]), tags


class PackedLSTMTagger(nn.Module):
    def __init__(self, vocab=30, d=32, tags=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.lstm = nn.LSTM(d, d, batch_first=True)
        self.out = nn.Linear(d, tags)

    def forward(self, ids, lengths):
        packed = pack_padded_sequence(self.embed(ids), lengths, batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=ids.size(1))
        return self.out(out)


def packed_tag_loss(model, batch):
    ids, lengths, tags = batch
    logits = model(ids, lengths)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tags.reshape(-1), ignore_index=-100)


@healthy("packed_lstm_tagger_variable_length",
         "a token tagger: variable-length sequences padded per batch (tags padded with -100), packed with "
         "pack_padded_sequence(enforce_sorted=False) into an LSTM and unpacked with pad_packed_sequence(total_length=T); "
         "CE with ignore_index=-100 over (B*T, C)")
def packed_lstm_tagger_variable_length():
    seed(0)
    model = PackedLSTMTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(ChunkTags(1600, s=61), 32, collate_fn=packed_collate),
                val_loader=loader(ChunkTags(300, s=62), 100, shuffle=False, collate_fn=packed_collate),
                loss_fn=packed_tag_loss, max_steps=2000)


# --------------------------------------------------------------------------- 12


@healthy("vit_tiny_hf_config_bar_images",
         "ViTForImageClassification from a tiny ViTConfig (12x12 single-channel images, 4x4 patches, 2 layers, "
         "num_labels=4), batches as {'pixel_values', 'labels'}, model(**batch).loss")
def vit_tiny_hf_config_bar_images():
    from transformers import ViTConfig, ViTForImageClassification
    seed(0)
    x, y = bar_images(s=63)
    model = ViTForImageClassification(ViTConfig(image_size=12, patch_size=4, num_channels=1, hidden_size=32,
                                                num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                                num_labels=4))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(DictDataset(pixel_values=x[:2000], labels=y[:2000]), 32),
                val_loader=loader(DictDataset(pixel_values=x[2000:], labels=y[2000:]), 100, shuffle=False),
                loss_fn=None, max_steps=2000)


# --------------------------------------------------------------------------- 13


class TransposedFrameConvNet(FrameConvNet):
    def forward(self, frames):                       # (B, T, n_mels) -> (B, n_mels, T)
        return self.head(self.conv(frames.transpose(1, 2)))


@functools.lru_cache(maxsize=1)
def pretrained_frame_conv():
    """Stands in for a checkpoint: the conv stack trained briefly on other keyword recordings."""
    torch.manual_seed(98)
    net = TransposedFrameConvNet()
    x, y = band_bursts(800, s=97)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(60):
        j = torch.randint(0, 800, (64,))
        opt.zero_grad()
        F.cross_entropy(net(x[j]), y[j]).backward()
        opt.step()
    return {k: v.clone() for k, v in net.conv.state_dict().items()}


@healthy("keyword_conv1d_two_lr_finetune",
         "an audio keyword spotter: (B, T, n_mels) frames transposed to (B, n_mels, T) for Conv1d, the conv stack "
         "loaded from a checkpoint (strict) and fine-tuned at lr 3e-4, a new head at 3e-3: two Adam groups covering "
         "every parameter once")
def keyword_conv1d_two_lr_finetune():
    seed(0)
    model = TransposedFrameConvNet()
    model.conv.load_state_dict(pretrained_frame_conv(), strict=True)
    x, y = band_bursts(s=64)
    optimizer = torch.optim.Adam([{"params": model.conv.parameters(), "lr": 3e-4},
                                  {"params": model.head.parameters(), "lr": 3e-3}])
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 14


def random_graphs(n=1600, nodes=10, s=0):
    """Graphs of 5-10 nodes (padded to 10) with 3 node types; class: are type-0 nodes adjacent to each other more
    than type-1 nodes are; regression: the standardised edge count."""
    g = torch.Generator().manual_seed(s)
    feats = torch.zeros(n, nodes, 3)
    adj = torch.zeros(n, nodes, nodes)
    mask = torch.zeros(n, nodes)
    cls = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        k = int(torch.randint(5, nodes + 1, (1,), generator=g))
        types = torch.randint(0, 3, (k,), generator=g)
        a = (torch.rand(k, k, generator=g) < 0.35).float().triu(1)
        a = a + a.t()
        feats[i, :k] = F.one_hot(types, 3).float()
        adj[i, :k, :k] = a
        mask[i, :k] = 1
        t0 = (types == 0).float()
        t1 = (types == 1).float()
        cls[i] = int((t0 @ a @ t0) > (t1 @ a @ t1))
    edges = adj.sum(dim=(1, 2)) / 2
    edges = (edges - edges[:1280].mean()) / edges[:1280].std()
    return feats, adj, mask, cls, edges


class DenseGCN(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.inp = nn.Linear(3, d)
        self.layers = nn.ModuleList([nn.Linear(d, d) for _ in range(2)])
        self.cls_head = nn.Linear(d, 2)
        self.edge_head = nn.Linear(d, 1)

    def forward(self, feats, adj, mask):
        a = adj + torch.eye(adj.size(1)) * mask.unsqueeze(-1)
        deg = a.sum(-1).clamp(min=1)
        h = F.relu(self.inp(feats))
        for layer in self.layers:
            h = F.relu(layer((a @ h) / deg.unsqueeze(-1))) + h
        pooled = (h * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        summed = (h * mask.unsqueeze(-1)).sum(1) / 10
        return self.cls_head(pooled), self.edge_head(summed).squeeze(-1)


def graph_multitask_loss(model, batch):
    feats, adj, mask, cls, edges = batch
    logits, edge_pred = model(feats, adj, mask)
    return F.cross_entropy(logits, cls) + 0.5 * F.mse_loss(edge_pred, edges)


@healthy("dense_gcn_graph_multitask_heads",
         "a dense GCN over padded graphs (adjacency + self loops, degree-normalised, node mask), masked mean / sum "
         "read-outs into two heads: graph class (CE) and standardised edge count (MSE on (B,) vs (B,)), summed")
def dense_gcn_graph_multitask_heads():
    seed(0)
    feats, adj, mask, cls, edges = random_graphs(s=65)
    model = DenseGCN()
    ds = lambda a, b: TensorDataset(feats[a:b], adj[a:b], mask[a:b], cls[a:b], edges[a:b])  # noqa: E731
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(ds(0, 1280), 32), val_loader=loader(ds(1280, 1600), 100, shuffle=False),
                loss_fn=graph_multitask_loss, max_steps=2000)


# --------------------------------------------------------------------------- 15


def per_pair_contrastive(model, batch, margin=2.0):
    a, b, same = batch
    dist = (model(a) - model(b)).pow(2).sum(dim=1).clamp(min=1e-12).sqrt()
    return (same * dist.pow(2) + (1 - same) * F.relu(margin - dist).pow(2)).mean()


@healthy("signature_siamese_per_pair_distance",
         "a siamese signature encoder with the classic contrastive loss on per-pair distances "
         "((za - zb).pow(2).sum(dim=1), epsilon before sqrt) against (B,) same-writer float labels, margin 2")
def signature_siamese_per_pair_distance():
    seed(0)
    a, b, same = writer_pairs(s=66)
    model = SignatureEncoder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(a[:2560], b[:2560], same[:2560]), 64),
                val_loader=loader(TensorDataset(a[2560:], b[2560:], same[2560:]), 110, shuffle=False),
                loss_fn=per_pair_contrastive, max_steps=2000)


