"""Set ac, healthy: five corrected twins of broken cases and five unusual but correct setups. None may warn."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ac.cases_data import arrow_icons, icon_cnn, validation_features_not_standardized
from benchmarks.blind_preflight_ac.cases_mechanics import lambdalr_returns_lr_not_factor
from benchmarks.blind_preflight_ac.cases_shapes import color_tiles, lstm_missing_batch_first
from benchmarks.blind_preflight_ac.cases_targets import pos_weight_inverted
from benchmarks.blind_preflight_ac.cases_trained import SmallBackbone, optimizer_from_earlier_model_instance
from benchmarks.blind_preflight_ac.registry import gen, healthy, loader, seed, twin

# --- corrected twins -----------------------------------------------------------------------------------------------

healthy("lstm_batch_first_fixed", "The drift LSTM built with batch_first=True, read at out[:, -1, :].")(
    twin(lstm_missing_batch_first))
healthy("pos_weight_neg_over_pos_fixed", "Fraud BCEWithLogitsLoss with pos_weight = n_neg / n_pos.")(
    twin(pos_weight_inverted))
healthy("optimizer_on_current_model_fixed", "The optimizer built on the model instance that is trained.")(
    twin(optimizer_from_earlier_model_instance))
healthy("lambdalr_factor_fixed", "LambdaLR whose lambda returns the decay factor 0.999 ** step.")(
    twin(lambdalr_returns_lr_not_factor))
healthy("validation_standardized_fixed", "Validation features standardised with the training mean and std.")(
    twin(validation_features_not_standardized))


# --- a tiny BERT from a config, padded batches as dicts, model(**batch).loss --------------------------------------

def ticket_batches(n, s, vocab=120):
    g = gen(s)
    rows = []
    for _ in range(n):
        k = int(torch.randint(0, 3, (1,), generator=g))
        length = int(torch.randint(6, 20, (1,), generator=g))
        ids = torch.randint(10, vocab, (length,), generator=g)
        ids[torch.randperm(length, generator=g)[:2]] = 3 + 2 * k + torch.randint(0, 2, (2,), generator=g)
        rows.append((torch.cat([torch.tensor([1]), ids]), k))         # 1 = [CLS]
    return rows


def pad_collate(rows):
    longest = max(len(ids) for ids, _ in rows)
    input_ids = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, (ids, _) in enumerate(rows):
        input_ids[i, :len(ids)] = ids
        mask[i, :len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": torch.tensor([k for _, k in rows])}


@healthy("tiny_bert_from_config_padded", "A 2-layer BertForSequenceClassification built from a BertConfig (no "
         "download), dynamically padded dict batches with attention_mask, loss from model(**batch).loss, AdamW with "
         "linear warm-up.")
def tiny_bert_from_config_padded():
    from transformers import BertConfig, BertForSequenceClassification
    seed(0)
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=3, pad_token_id=0)
    model = BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    rows = ticket_batches(900, 51)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(rows[:700], 32, collate_fn=pad_collate),
                val_loader=loader(rows[700:], 64, shuffle=False, collate_fn=pad_collate),
                loss_fn=None, max_steps=600)


# --- frozen backbone on purpose, only the new head in the optimizer ---------------------------------------------

@healthy("frozen_backbone_new_head", "Feature extraction done right: backbone frozen with requires_grad=False, "
         "model.fc replaced first, then the optimizer built on model.fc.parameters() only.")
def frozen_backbone_new_head():
    seed(0)
    x, y = color_tiles(1400, 52)
    x = 3.0 * x.permute(0, 3, 1, 2).contiguous()      # contrast-stretched tiles
    model = SmallBackbone()
    for p in model.features.parameters():
        p.requires_grad = False
    model.fc = nn.Linear(24, 3)
    return dict(model=model, optimizer=torch.optim.Adam(model.fc.parameters(), lr=3e-2),
                train_loader=loader(TensorDataset(x[:1100], y[:1100]), 32),
                val_loader=loader(TensorDataset(x[1100:], y[1100:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=800)


# --- multi-task tabular model with two learning rates --------------------------------------------------------------

class MultiTask(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.churn = nn.Linear(64, 2)
        self.spend = nn.Linear(64, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.churn(h), self.spend(h).squeeze(-1)


def multitask_loss(model, batch):
    x, churned, spend = batch
    logits, predicted_spend = model(x)
    return F.cross_entropy(logits, churned) + 0.5 * F.mse_loss(predicted_spend, spend)


@healthy("multitask_heads_two_lr_groups", "A shared trunk with a churn head (cross-entropy) and a spend head (MSE), "
         "one summed loss, AdamW with a lower LR for the trunk than for the heads.")
def multitask_heads_two_lr_groups():
    seed(0)
    g = gen(53)
    x = torch.randn(1800, 10, generator=g)
    churned = ((x[:, 0] + x[:, 1] * x[:, 2]) > 0.3).long()
    spend = torch.tanh(x[:, 3] - x[:, 4]) + 0.1 * torch.randn(1800, generator=g)
    model = MultiTask()
    optimizer = torch.optim.AdamW([{"params": model.trunk.parameters(), "lr": 1e-3},
                                   {"params": list(model.churn.parameters()) + list(model.spend.parameters()),
                                    "lr": 3e-3}], weight_decay=1e-4)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:1400], churned[:1400], spend[:1400]), 32),
                val_loader=loader(TensorDataset(x[1400:], churned[1400:], spend[1400:]), 128, shuffle=False),
                loss_fn=multitask_loss, max_steps=1200)


# --- packed GRU over variable-length sessions, gradient accumulation and clipping -----------------------------------

class SessionGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(3, 32, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h_n = self.gru(packed)
        return self.head(h_n[-1])


def session_loss(model, batch):
    x, lengths, y = batch
    return F.cross_entropy(model(x, lengths), y)


@healthy("packed_gru_accumulation_clipping", "Variable-length sensor sessions zero-padded and packed with "
         "pack_padded_sequence(enforce_sorted=False, lengths on the CPU), h_n as the summary, 2-step gradient "
         "accumulation and clip_grad_norm=1.0.")
def packed_gru_accumulation_clipping():
    seed(0)
    g = gen(54)
    n, longest = 1400, 30
    lengths = torch.randint(5, longest + 1, (n,), generator=g)
    x = torch.randn(n, longest, 3, generator=g)
    y = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        x[i, lengths[i]:] = 0.0
        y[i] = int(x[i, :lengths[i], 0].mean() > 0)
    model = SessionGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1100], lengths[:1100], y[:1100]), 16),
                val_loader=loader(TensorDataset(x[1100:], lengths[1100:], y[1100:]), 128, shuffle=False),
                loss_fn=session_loss, accumulation_steps=2, clip_grad_norm=1.0, max_steps=600)


# --- bf16 CNN with OneCycleLR and label smoothing -----------------------------------------------------------------

@healthy("bf16_cnn_onecycle_label_smoothing", "A small CNN on icons under bf16 autocast, OneCycleLR over the run's "
         "steps (stepped per batch), CrossEntropyLoss(label_smoothing=0.1), clip_grad_norm=1.0.")
def bf16_cnn_onecycle_label_smoothing():
    seed(0)
    x, y = arrow_icons(1400, 55)
    model = icon_cnn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=800)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(x[:1100], y[:1100]), 32),
                val_loader=loader(TensorDataset(x[1100:], y[1100:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1), precision="bf16", clip_grad_norm=1.0,
                max_steps=800)
