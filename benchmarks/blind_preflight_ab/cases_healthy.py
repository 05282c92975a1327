"""Set ab's healthy cases: five corrected twins of broken cases and five unusual but correct fine-tuning setups.
None of them should raise a warning or an error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ab.cases_data import category_codes_refit_on_val
from benchmarks.blind_preflight_ab.cases_mechanics import distilbert_schedule_one_epoch
from benchmarks.blind_preflight_ab.cases_shapes import gpt2_review_classifier
from benchmarks.blind_preflight_ab.cases_targets import DictRows, t5_decoder_inputs_unshifted
from benchmarks.blind_preflight_ab.cases_trained import _ticket_tokens, bert_unfreeze_after_optimizer
from benchmarks.blind_preflight_ab.registry import gen, healthy, loader, seed, twin

# ---- corrected twins -------------------------------------------------------------------------------------------

healthy("healthy_gpt2_last_token_pool",
        "Twin of shapes_gpt2_first_token_pool: the GPT-2 review classifier pools the last non-padding token.")(
    twin(gpt2_review_classifier))
healthy("healthy_t5_labels_only",
        "Twin of targets_t5_decoder_inputs_unshifted: T5 batches carry labels only; T5 shifts them right itself.")(
    twin(t5_decoder_inputs_unshifted))
healthy("healthy_bert_unfreeze_then_optimizer",
        "Twin of trained_bert_unfreeze_after_optimizer: the top BERT layer and pooler are unfrozen before the "
        "optimizer is built on the trainable parameters; the rest of the encoder stays frozen on purpose.")(
    twin(bert_unfreeze_after_optimizer))
healthy("healthy_distilbert_schedule_all_epochs",
        "Twin of mechanics_schedule_total_one_epoch: the linear warm-up schedule spans len(train_loader) * epochs.")(
    twin(distilbert_schedule_one_epoch))
healthy("healthy_city_codes_shared_vocab",
        "Twin of data_category_codes_refit_on_val: validation cities encoded with the training vocabulary.")(
    twin(category_codes_refit_on_val))


# ---- unusual but correct -----------------------------------------------------------------------------------------

def _quadrant_images(n, s, size=16):
    g = gen(s)
    q = torch.randint(0, 4, (n,), generator=g)
    cx = (q % 2) * (size // 2) + torch.randint(2, size // 2 - 2, (n,), generator=g)
    cy = (q // 2) * (size // 2) + torch.randint(2, size // 2 - 2, (n,), generator=g)
    grid = torch.arange(size).float()
    img = torch.exp(-((grid[None, None, :] - cx[:, None, None].float()) ** 2
                      + (grid[None, :, None] - cy[:, None, None].float()) ** 2) / 4.0)
    img = img + 0.1 * torch.randn(n, size, size, generator=g)
    return img[:, None], q


@healthy("healthy_vit_from_config_bf16",
         "A tiny ViTForImageClassification built from a ViTConfig (16x16 single-channel images, 4x4 patches), "
         "model(**batch).loss on dict batches, AdamW with a cosine warm-up schedule over max_steps, bf16 autocast.")
def vit_from_config_bf16():
    from transformers import ViTConfig, ViTForImageClassification, get_cosine_schedule_with_warmup
    seed(0)
    img, q = _quadrant_images(1400, 40)
    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=1, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=64, num_labels=4, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
    model = ViTForImageClassification(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=20, num_training_steps=300)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(DictRows(pixel_values=img[:1200], labels=q[:1200]), 32),
                val_loader=loader(DictRows(pixel_values=img[1200:], labels=q[1200:]), 100, shuffle=False),
                loss_fn=None, precision="bf16", max_steps=300)


class FrozenItemTwoTower(nn.Module):
    def __init__(self, item_vectors, n_users, dim):
        super().__init__()
        self.item = nn.Embedding.from_pretrained(item_vectors, freeze=True)    # catalogue vectors, kept fixed
        self.user = nn.Embedding(n_users, dim)
        self.user_mlp = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, item_vectors.size(1)))

    def forward(self, users, cands):
        q = self.user_mlp(self.user(users))                      # (B, D)
        return (q.unsqueeze(1) * self.item(cands)).sum(-1)       # (B, K)


@healthy("healthy_two_tower_frozen_items_accum",
         "A two-tower recommender whose item tower is a frozen pretrained embedding (from_pretrained, freeze=True) "
         "on purpose; only the user tower trains, with 4-step gradient accumulation and gradient clipping at 1.0.")
def two_tower_frozen_items_accum():
    seed(0)
    g = gen(41)
    style = torch.randn(200, 8, generator=g)
    taste = torch.randn(150, 8, generator=g)
    users = torch.randint(0, 150, (3000,), generator=g)
    cands = torch.stack([torch.randperm(200, generator=g)[:6] for _ in range(3000)])
    y = ((taste[users][:, None, :] * style[cands]).sum(-1)).argmax(1)
    model = FrozenItemTwoTower(style, 150, 16)
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2),
                train_loader=loader(TensorDataset(users[:2500], cands[:2500], y[:2500]), 16),
                val_loader=loader(TensorDataset(users[2500:], cands[2500:], y[2500:]), 100, shuffle=False),
                loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]),
                accumulation_steps=4, clip_grad_norm=1.0, max_steps=200)


class SessionGRU(nn.Module):
    def __init__(self, n_items=40, dim=24):
        super().__init__()
        self.emb = nn.Embedding(n_items, dim, padding_idx=0)    # 0 is padding here, real items are 1..39
        self.gru = nn.GRU(dim, 48, batch_first=True)
        self.out = nn.Linear(48, 4)

    def forward(self, items, lengths):
        packed = pack_padded_sequence(self.emb(items), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h = self.gru(packed)
        return self.out(h[-1])


@healthy("healthy_packed_gru_sessions",
         "Variable-length shopping sessions padded with a reserved id 0 (padding_idx=0), read by a GRU through "
         "pack_padded_sequence(enforce_sorted=False) with CPU lengths; the label is the category of the session's "
         "last real item.")
def packed_gru_sessions():
    seed(0)
    g = gen(42)
    n, t = 2000, 14
    lengths = torch.randint(3, t + 1, (n,), generator=g)
    items = torch.randint(1, 40, (n, t), generator=g)
    items[torch.arange(t)[None, :] >= lengths[:, None]] = 0
    last = items[torch.arange(n), lengths - 1]
    y = last % 4
    model = SessionGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(items[:1600], lengths[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(items[1600:], lengths[1600:], y[1600:]), 100, shuffle=False),
                loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]), max_steps=300)


class TicketTriage(nn.Module):
    """DistilBERT over the ticket text plus a small MLP over numeric account features; two heads: the urgency class
    and the (standardised) hours to resolution."""

    def __init__(self):
        super().__init__()
        from transformers import DistilBertConfig, DistilBertModel
        cfg = DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                               max_position_embeddings=32, dropout=0.0, attention_dropout=0.0, pad_token_id=0)
        self.text = DistilBertModel(cfg)
        self.tab = nn.Sequential(nn.Linear(5, 16), nn.ReLU())
        self.urgency = nn.Linear(48, 2)
        self.hours = nn.Linear(48, 1)

    def forward(self, ids, mask, feats):
        h = self.text(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
        z = torch.cat([h, self.tab(feats)], 1)
        return self.urgency(z), self.hours(z)[:, 0]


@healthy("healthy_distilbert_multi_input_two_lrs",
         "A multi-input model (DistilBERT text encoder + numeric account features) with two heads whose losses are "
         "summed as 0.7 * CE + 0.3 * MSE on a standardised target, the encoder at a 5x lower learning rate than the "
         "new layers (two AdamW groups), linear warm-up over max_steps.")
def distilbert_multi_input_two_lrs():
    from transformers import get_linear_schedule_with_warmup
    seed(0)
    ids, urgent = _ticket_tokens(1800, 43)
    n = len(ids)
    g = gen(44)
    feats = torch.randn(n, 5, generator=g)
    hours = 0.8 * feats[:, 0] - 0.5 * feats[:, 1] + 0.6 * urgent.float() + 0.1 * torch.randn(n, generator=g)
    hours = (hours - hours[:1300].mean()) / hours[:1300].std()
    mask = torch.ones_like(ids)
    model = TicketTriage()
    groups = [{"params": model.text.parameters(), "lr": 4e-4},
              {"params": list(model.tab.parameters()) + list(model.urgency.parameters())
               + list(model.hours.parameters()), "lr": 2e-3}]
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=15, num_training_steps=300)

    def loss_fn(model, batch):
        i, m, f, u, h = batch
        logits, pred = model(i, m, f)
        return 0.7 * F.cross_entropy(logits, u) + 0.3 * F.mse_loss(pred, h)
    data = (ids, mask, feats, urgent, hours)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(*(d[:1300] for d in data)), 32),
                val_loader=loader(TensorDataset(*(d[1300:] for d in data)), 100, shuffle=False),
                loss_fn=loss_fn, clip_grad_norm=1.0, max_steps=300)


class TabularEmbeddings(nn.Module):
    def __init__(self, cards=(12, 7, 30), dim=6):
        super().__init__()
        self.embs = nn.ModuleList([nn.Embedding(c, dim) for c in cards])
        self.mlp = nn.Sequential(nn.Linear(dim * len(cards) + 4, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))

    def forward(self, cats, nums):
        z = torch.cat([e(cats[:, k]) for k, e in enumerate(self.embs)] + [nums], 1)
        return self.mlp(z)[:, 0]


@healthy("healthy_tabular_embeddings_onecycle_bf16",
         "A tabular regressor with three categorical embeddings (code 0 is a real category, no padding_idx) and "
         "standardised numeric columns, OneCycleLR stepped per optimizer step with total_steps=max_steps, "
         "2-step accumulation and bf16 autocast.")
def tabular_embeddings_onecycle_bf16():
    seed(0)
    g = gen(45)
    n = 3000
    cats = torch.stack([torch.randint(0, c, (n,), generator=g) for c in (12, 7, 30)], 1)
    nums = torch.randn(n, 4, generator=g)
    effects = [torch.randn(c, generator=g) for c in (12, 7, 30)]
    y = sum(e[cats[:, k]] for k, e in enumerate(effects)) + 0.5 * nums[:, 0] + 0.1 * torch.randn(n, generator=g)
    model = TabularEmbeddings()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=300)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(cats[:2500], nums[:2500], y[:2500]), 32),
                val_loader=loader(TensorDataset(cats[2500:], nums[2500:], y[2500:]), 100, shuffle=False),
                loss_fn=lambda m, b: F.mse_loss(m(b[0], b[1]).float(), b[2]),
                accumulation_steps=2, precision="bf16", max_steps=300)
