"""Healthy: 5 corrected twins of broken cases and 5 unusual but correct setups; none may raise a warning."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import Dataset, TensorDataset

from .cases_data import data_last_step_of_right_padded_batch
from .cases_mechanics import mechanics_accumulation_scaled_twice
from .cases_shapes import shapes_time_major_logits_flattened_against_batch_major_labels
from .cases_targets import targets_binary_mask_255_ignored
from .cases_trained import trained_head_replaced_after_optimizer
from .registry import gen, healthy, loader, seed, twin

# --- the corrected twins -------------------------------------------------------------------------------------------

healthy("healthy_twin_masks_scaled_to_class_ids",
        "binary PNG masks divided by 255 to class ids 0/1, CrossEntropyLoss(ignore_index=255) kept for void pixels")(
    twin(targets_binary_mask_255_ignored))
healthy("healthy_twin_head_replaced_then_optimizer",
        "frozen pretrained backbone on purpose; the new 5-class head is built first and the optimizer on it after")(
    twin(trained_head_replaced_after_optimizer))
healthy("healthy_twin_accumulation_scaled_once",
        "8-step gradient accumulation with plain SGD; loss_fn returns the mean loss, the loop divides once")(
    twin(mechanics_accumulation_scaled_twice))
healthy("healthy_twin_last_real_step_gathered",
        "right-padded sessions; the RNN output is gathered at lengths - 1 for each session")(
    twin(data_last_step_of_right_padded_batch))
healthy("healthy_twin_time_major_logits_transposed",
        "seq-first GRU tagger whose (T, B, C) logits are transposed to (B, T, C) before flattening with the labels")(
    twin(shapes_time_major_logits_flattened_against_batch_major_labels))


# --- H1: a tiny BERT for token classification built from a config, -100 on padding ----------------------------------

class TokenDicts(Dataset):
    def __init__(self, n, s):
        g = gen(s)
        self.rows = []
        table = torch.randint(0, 4, (60,), generator=gen(201))
        for _ in range(n):
            length = int(torch.randint(6, 21, (1,), generator=g))
            ids = torch.randint(5, 60, (length,), generator=g)
            labels = table[ids]
            pad = 20 - length
            self.rows.append(dict(
                input_ids=torch.cat([ids, torch.zeros(pad, dtype=torch.long)]),
                attention_mask=torch.cat([torch.ones(length, dtype=torch.long), torch.zeros(pad, dtype=torch.long)]),
                labels=torch.cat([labels, torch.full((pad,), -100, dtype=torch.long)])))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


@healthy("healthy_tiny_bert_token_tags_from_config",
         "BertForTokenClassification from a 2-layer BertConfig (no download), padded batches with attention_mask "
         "and -100 labels on the padding, loss from model(**batch).loss, AdamW with linear warm-up")
def healthy_tiny_bert_token_tags_from_config():
    from transformers import BertConfig, BertForTokenClassification
    seed(0)
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=4, pad_token_id=0)
    model = BertForTokenClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=loader(TokenDicts(1024, 1), 32),
                val_loader=loader(TokenDicts(256, 2), 64, shuffle=False), loss_fn=None, max_steps=300)


# --- H2: a multi-task model with two heads, a hand-written joint loss and two learning rates -------------------------

class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.kind = nn.Linear(64, 3)
        self.amount = nn.Linear(64, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.kind(h), self.amount(h).squeeze(-1)


def _orders(n, s):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    w = torch.randn(10, 3, generator=gen(211))
    v = torch.randn(10, generator=gen(212)) / 3
    return x, (x @ w).argmax(1), torch.tanh(x @ v) + 0.05 * torch.randn(n, generator=g)


def joint_loss(model, batch):
    x, kind, amount = batch
    logits, pred = model(x)
    return F.cross_entropy(logits, kind) + 0.5 * F.mse_loss(pred, amount)


@healthy("healthy_multitask_two_heads_two_lrs",
         "shared trunk with a classification and a regression head, a hand-written joint loss on 3-tuple batches, "
         "the trunk at a lower learning rate than the heads")
def healthy_multitask_two_heads_two_lrs():
    seed(0)
    model = TwoHeads()
    opt = torch.optim.Adam([{"params": model.trunk.parameters(), "lr": 1e-3},
                            {"params": list(model.kind.parameters()) + list(model.amount.parameters()), "lr": 3e-3}])
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(*_orders(2048, 1)), 64),
                val_loader=loader(TensorDataset(*_orders(512, 2)), 256, shuffle=False), loss_fn=joint_loss,
                max_steps=300)


# --- H3: a fixed edge-filter stem (frozen on purpose), accumulation, bf16, clipping, cosine ---------------------------

class EdgeStemCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 2, 3, padding=1, bias=False)
        sobel = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])
        with torch.no_grad():
            self.stem.weight.copy_(torch.stack([sobel, sobel.t()])[:, None])
        self.stem.weight.requires_grad_(False)           # a fixed Sobel front end, by design
        self.body = nn.Sequential(nn.ReLU(), nn.Conv2d(2, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                                  nn.Flatten(), nn.Linear(64, 3))

    def forward(self, x):
        return self.body(self.stem(x))


def _edges(n, s):
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    img = 0.2 * torch.randn(n, 1, 12, 12, generator=g)
    for i in range(n):
        k = int(y[i])
        if k == 0:
            img[i, 0, :, 6:] += 1.0
        elif k == 1:
            img[i, 0, 6:, :] += 1.0
        else:
            img[i, 0, 3:9, 3:9] += 1.0
    return img, y


@healthy("healthy_frozen_sobel_stem_accum_bf16",
         "a Sobel first layer frozen on purpose (left out of the optimizer), 4-step accumulation, bf16 autocast, "
         "clip_grad_norm 1.0 and a cosine schedule sized to max_steps")
def healthy_frozen_sobel_stem_accum_bf16():
    seed(0)
    model = EdgeStemCNN()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=200)
    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=loader(TensorDataset(*_edges(1024, 3)), 16),
                val_loader=loader(TensorDataset(*_edges(256, 4)), 64, shuffle=False), loss_fn=nn.CrossEntropyLoss(),
                precision="bf16", accumulation_steps=4, clip_grad_norm=1.0, max_steps=200)


# --- H4: a packed LSTM over unsorted variable-length readings ---------------------------------------------------------

def _readings(n, s):
    g = gen(s)
    lengths = torch.randint(4, 25, (n,), generator=g)
    seqs = [torch.randn(int(L), 3, generator=g) for L in lengths]
    labels = torch.tensor([int(q[:, 0].mean() > 0) + 2 * int(q[-1, 1] > 0) for q in seqs])
    return list(zip(seqs, labels))


def collate_readings(batch):
    seqs, labels = zip(*batch)
    lengths = torch.tensor([len(q) for q in seqs])
    return pad_sequence(seqs, batch_first=True), lengths, torch.stack(labels)


class PackedLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(3, 32, batch_first=True)
        self.head = nn.Linear(32, 4)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (h, _) = self.rnn(packed)
        return self.head(h[-1])


def packed_loss(model, batch):
    x, lengths, y = batch
    return F.cross_entropy(model(x, lengths), y)


@healthy("healthy_packed_lstm_unsorted_lengths",
         "variable-length sensor readings padded in a collate_fn and packed with pack_padded_sequence("
         "enforce_sorted=False); the class comes from h_n, which packing puts at each sequence's own last step")
def healthy_packed_lstm_unsorted_lengths():
    seed(0)
    model = PackedLSTM()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(_readings(1536, 5), 32, collate_fn=collate_readings),
                val_loader=loader(_readings(384, 6), 128, shuffle=False, collate_fn=collate_readings),
                loss_fn=packed_loss, max_steps=300)


# --- H5: a tiny GPT-2 language model from a config with a OneCycle schedule ------------------------------------------

class LMRows(Dataset):
    def __init__(self, n, s):
        g = gen(s)
        start = torch.randint(0, 40, (n, 1), generator=g)
        step = torch.randint(1, 4, (n, 1), generator=g)
        self.ids = (start + step * torch.arange(24)) % 40 + 2

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return dict(input_ids=self.ids[i], labels=self.ids[i])   # the model shifts the labels itself


@healthy("healthy_tiny_gpt2_onecycle_from_config",
         "GPT2LMHeadModel from a 2-layer GPT2Config (no download), labels = input_ids (shifted inside the model), "
         "OneCycleLR with total_steps = max_steps and gradient clipping")
def healthy_tiny_gpt2_onecycle_from_config():
    from transformers import GPT2Config, GPT2LMHeadModel
    seed(0)
    config = GPT2Config(vocab_size=44, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=300)
    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=loader(LMRows(1024, 7), 32),
                val_loader=loader(LMRows(256, 8), 64, shuffle=False), loss_fn=None, max_steps=300,
                clip_grad_norm=1.0)
