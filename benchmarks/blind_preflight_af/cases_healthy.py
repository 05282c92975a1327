"""Healthy cases: must raise no warning. Five corrected twins of broken cases, five unusual but correct setups."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_af import cases_data, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_af.registry import gen, healthy, loader, seed, teacher_classes, twin

# --------------------------------------------------------------------------------------------- corrected twins
healthy("af_h_gnn_messages_in_neighbours",
        "Twin of af_gnn_messages_to_source: messages summed over in-neighbours, torch.bmm(adj.transpose(1, 2), x).")(
    twin(cases_shapes.gnn_messages))
healthy("af_h_pos_weight_neg_over_pos",
        "Twin of af_pos_weight_inverted: BCEWithLogitsLoss(pos_weight=n_neg / n_pos) on the 5%-positive set.")(
    twin(cases_targets.pos_weight))
healthy("af_h_censored_flag_converted",
        "Twin of af_survival_censor_flag_as_event: the Cox loss gets event = 1 - censored.")(
    twin(cases_targets.censor_flag))
healthy("af_h_from_pretrained_unfrozen",
        "Twin of af_from_pretrained_frozen_items: nn.Embedding.from_pretrained(content, freeze=False).")(
    twin(cases_trained.from_pretrained))
healthy("af_h_fm_with_field_offsets",
        "Twin of af_fm_shared_table_no_offsets: each field's ids shifted by the field offsets (0, 20, 40).")(
    twin(cases_data.fm_offsets))


# --------------------------------------------------------------------------------------------- tiny BERT from a config
class TokenRows(Dataset):
    """Tabular rows as token sequences (binned column values); label: does bin 7 occur in the row."""

    def __init__(self, n, s, length=16, vocab=40):
        g = gen(s)
        self.ids = torch.randint(3, vocab, (n, length), generator=g)
        self.ids[:, 0] = 2  # [CLS]
        lens = torch.randint(8, length + 1, (n,), generator=g)
        self.mask = (torch.arange(length)[None, :] < lens[:, None]).long()
        self.ids = self.ids * self.mask  # pad id 0
        self.labels = (self.ids == 7).any(1).long()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


@healthy("af_h_tiny_bert_token_rows",
         "A 2-layer BertForSequenceClassification built from a BertConfig (no download) on binned tabular rows with "
         "padding and attention masks; the loss is model(**batch).loss, AdamW with a linear warm-up.")
def tiny_bert():
    seed(0)
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=32, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, train_loader=loader(TokenRows(1500, 61), 32),
                val_loader=loader(TokenRows(300, 62), 100, shuffle=False), loss_fn=None, max_steps=1000)


# --------------------------------------------------------------------------------------------- packed GRU
class SensorRuns(Dataset):
    """Variable-length runs of 3 sensor channels, zero-padded to 40 steps; label: is the mean of channel 0 over the
    run's own steps positive."""

    def __init__(self, n, s, t=40):
        g = gen(s)
        self.lengths = torch.randint(5, t + 1, (n,), generator=g)
        self.x = torch.randn(n, t, 3, generator=g) + 0.3 * torch.randn(n, 1, 3, generator=g)
        self.x *= (torch.arange(t)[None, :, None] < self.lengths[:, None, None]).float()
        self.y = (self.x[..., 0].sum(1) / self.lengths > 0).long()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.lengths[i], self.y[i]


class PackedGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(3, 32, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h = self.gru(packed)
        return self.head(h[-1])


@healthy("af_h_packed_gru_sensor_runs",
         "A GRU over zero-padded variable-length sensor runs, packed with pack_padded_sequence(enforce_sorted=False, "
         "lengths on the CPU); the classifier reads the final hidden state of each run's own last step.")
def packed_gru():
    seed(0)
    model = PackedGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(SensorRuns(2000, 63), 32), val_loader=loader(SensorRuns(400, 64), 100, shuffle=False),
                loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]), max_steps=1000, clip_grad_norm=1.0)


# --------------------------------------------------------------------------------------------- multi-task under bf16
class MultiTask(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.yield_head, self.grade_head = nn.Linear(64, 1), nn.Linear(64, 3)

    def forward(self, x):
        h = self.trunk(x)
        return self.yield_head(h).squeeze(-1), self.grade_head(h)


@healthy("af_h_multitask_yield_and_grade_bf16",
         "One trunk, two heads: a regression head (standardised process yield, MSE) and a 3-class quality-grade head "
         "(cross-entropy), losses summed with a 0.5 weight, under bf16 autocast.")
def multitask():
    seed(0)
    g = gen(65)
    x = torch.randn(3000, 10, generator=g)
    yld = torch.tanh(x[:, 0]) + 0.5 * x[:, 1] * x[:, 2]
    grade = torch.bucketize(yld + 0.2 * torch.randn(3000, generator=g), torch.tensor([-0.5, 0.5]))
    model = MultiTask()

    def two_losses(model, batch):
        x, yld, grade = batch
        pred, logits = model(x)
        return F.mse_loss(pred.float(), yld) + 0.5 * F.cross_entropy(logits.float(), grade)

    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2500], yld[:2500], grade[:2500]), 64),
                val_loader=loader(TensorDataset(x[2500:], yld[2500:], grade[2500:]), 250, shuffle=False),
                loss_fn=two_losses, precision="bf16", max_steps=2000)


# --------------------------------------------------------------------------------------------- BPR, two LRs, accumulation
class BPRMatrixFactorization(nn.Module):
    def __init__(self, users=80, items=120, k=16):
        super().__init__()
        self.user, self.item = nn.Embedding(users, k), nn.Embedding(items, k)
        self.item_bias = nn.Embedding(items, 1)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.normal_(self.item.weight, std=0.1)
        nn.init.zeros_(self.item_bias.weight)

    def score(self, u, i):
        return (self.user(u) * self.item(i)).sum(-1) + self.item_bias(i).squeeze(-1)


def bpr_loss(model, batch):
    u, pos, neg = batch
    return -F.logsigmoid(model.score(u, pos) - model.score(u, neg)).mean()


@healthy("af_h_bpr_two_lrs_accumulation",
         "Implicit-feedback BPR matrix factorisation: (user, clicked item, sampled unclicked item) triples, embeddings "
         "at lr 0.05 and item biases at lr 0.01 in two param groups, 4-step gradient accumulation, clipping at 1.0 "
         "and a cosine schedule over max_steps.")
def bpr():
    seed(0)
    gf = gen(66)
    tu, ti = torch.randn(80, 6, generator=gf), torch.randn(120, 6, generator=gf)
    liked = (tu @ ti.T) > 0.5
    g = gen(67)
    users = torch.randint(0, 80, (20000,), generator=g)
    pos = torch.multinomial(liked[users].float() + 1e-6, 1, generator=g).squeeze(1)
    neg = torch.multinomial((~liked[users]).float() + 1e-6, 1, generator=g).squeeze(1)
    model = BPRMatrixFactorization()
    optimizer = torch.optim.Adam([{"params": [model.user.weight, model.item.weight], "lr": 5e-2},
                                  {"params": model.item_bias.parameters(), "lr": 1e-2}])
    steps = 400
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps),
                train_loader=loader(TensorDataset(users[:16000], pos[:16000], neg[:16000]), 64),
                val_loader=loader(TensorDataset(users[16000:], pos[16000:], neg[16000:]), 500, shuffle=False),
                loss_fn=bpr_loss, accumulation_steps=4, clip_grad_norm=1.0, max_steps=steps)


# --------------------------------------------------------------------------------------------- frozen encoder on purpose
@healthy("af_h_linear_probe_frozen_encoder",
         "A linear probe on purpose: the (stand-in pretrained) encoder is frozen with requires_grad=False, the model "
         "is left in train mode, and the optimizer gets only the new head's parameters, built after the head.")
def linear_probe():
    seed(0)
    x, y = teacher_classes(4000, 12, 5, s=68)
    model = cases_trained.EncoderClassifier(classes=5)
    for p in model.encoder.parameters():
        p.requires_grad = False
    return dict(model=model, optimizer=torch.optim.Adam(model.head.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:3000], y[:3000]), 64),
                val_loader=loader(TensorDataset(x[3000:], y[3000:]), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)
