"""Set ak, healthy cases: 5 corrected twins of broken cases and 5 unusual but correct setups (must raise nothing)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_ak.cases_mechanics import warmup_rows
from benchmarks.blind_preflight_ak.cases_shapes import TinyFCN, bigru, first_token_data, rec_dot
from benchmarks.blind_preflight_ak.cases_targets import BOS, RunningSumDecoder, V, pos_weight
from benchmarks.blind_preflight_ak.cases_trained import demand_windows, head_after
from benchmarks.blind_preflight_ak.registry import gen, healthy, loader, seed, twin

# --- the corrected twins ---------------------------------------------------------------------------------------------

healthy("ak_h_rec_dot_sum_dim1", "Matrix factorisation with the dot product summed over dim=1 (twin of "
        "ak_rec_dot_sum_without_dim).")(twin(rec_dot))
healthy("ak_h_bigru_cat_directions", "Bidirectional GRU classifier concatenating h_n[0] and h_n[1] (twin of "
        "ak_bigru_hn_view_batch).")(twin(bigru))
healthy("ak_h_pos_weight_neg_over_pos", "5%-positive fraud label with BCEWithLogitsLoss(pos_weight=n_neg/n_pos) "
        "(twin of ak_pos_weight_inverted).")(twin(pos_weight))
healthy("ak_h_head_replaced_then_optimizer", "Frozen backbone, new 5-class head, optimizer built after the "
        "replacement (twin of ak_head_replaced_after_optimizer).")(twin(head_after))
healthy("ak_h_warmup_in_steps", "LambdaLR warm-up sized in optimizer steps (10% of epochs * len(train_loader)) "
        "with SGD momentum (twin of ak_warmup_counted_in_rows).")(twin(warmup_rows))

# --- unusual but correct -------------------------------------------------------------------------------------------


class DictDataset(Dataset):
    def __init__(self, **cols):
        self.cols = cols

    def __len__(self):
        return len(next(iter(self.cols.values())))

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.cols.items()}


@healthy("ak_h_tiny_bert_padded_dict_batches",
         "A 2-layer BertForSequenceClassification built from a BertConfig (hidden 32), dict batches with input_ids, "
         "attention_mask and labels over right-padded sequences of 5-16 tokens, loss from model(**batch).loss, AdamW "
         "with a linear decay schedule.")
def tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification
    seed(0)
    g = gen(30)
    n, T = 1200, 16
    ids = torch.randint(5, 60, (n, T), generator=g)
    ids[:, 0] = 2                                            # [CLS]
    labels = ids[:, 1] % 3
    lengths = torch.randint(5, T + 1, (n,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    ids = ids * mask                                         # pad id 0
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=3)
    model = BertForSequenceClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=1000)
    return dict(model=model, optimizer=opt, scheduler=sched,
                train_loader=loader(DictDataset(input_ids=ids, attention_mask=mask, labels=labels), 32),
                loss_fn=None, max_steps=1000)


def _padded_running_sum(n, T=10, s=0):
    g = gen(s)
    src = torch.randint(0, V, (n, T), generator=g)
    tgt = src.cumsum(1) % V
    lengths = torch.randint(4, T + 1, (n,), generator=g)
    pad = torch.arange(T)[None, :] >= lengths[:, None]
    return src.masked_fill(pad, 0), tgt.masked_fill(pad, -100)


@healthy("ak_h_seq2seq_padded_ignore_index",
         "The running-sum decoder on variable-length sequences: targets padded with -100 and ignored by "
         "cross_entropy, decoder input = targets shifted right behind BOS with the padding mapped to token 0.")
def seq2seq_padded():
    seed(0)
    src, tgt = _padded_running_sum(1500, s=31)
    model = RunningSumDecoder()

    def loss_fn(model, batch):
        s, t = batch
        dec_in = torch.cat([torch.full_like(t[:, :1], BOS), t[:, :-1].clamp(min=0)], 1)
        return F.cross_entropy(model(s, dec_in).reshape(-1, V), t.reshape(-1), ignore_index=-100)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(src, tgt), 32), loss_fn=loss_fn, max_steps=1500)


class ConvForecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(1, 16, 5, padding=2), nn.GELU(), nn.Conv1d(16, 16, 5, padding=2),
                                  nn.GELU())
        self.head = nn.Linear(16 * 24, 1)

    def forward(self, x):                                    # (N, 24) window
        return self.head(self.conv(x.unsqueeze(1)).flatten(1)).squeeze(-1)


@healthy("ak_h_conv1d_onecycle_clipped",
         "A 1-D CNN forecaster on 24-step windows, OneCycleLR(max_lr=1e-2, total_steps=max_steps) stepped every "
         "batch, clip_grad_norm=1.0, Huber loss.")
def conv_onecycle():
    seed(0)
    x, y = demand_windows(1600, s=32)
    model = ConvForecaster()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=1500)
    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=nn.HuberLoss(), clip_grad_norm=1.0, max_steps=1500)


class CategoricalMLP(nn.Module):
    def __init__(self, cards=(12, 7, 30), dim=6, numeric=5):
        super().__init__()
        self.embs = nn.ModuleList(nn.Embedding(c, dim) for c in cards)
        self.net = nn.Sequential(nn.Linear(dim * len(cards) + numeric, 64), nn.LayerNorm(64), nn.ReLU(),
                                 nn.Linear(64, 1))

    def forward(self, batch):
        cat, num = batch
        feats = [e(cat[:, i]) for i, e in enumerate(self.embs)] + [num]
        return self.net(torch.cat(feats, 1)).squeeze(-1)


def _tab_collate(rows):
    return ((torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])), torch.stack([r[2] for r in rows]))


@healthy("ak_h_tabular_embeddings_two_groups",
         "Store-sales regression with categorical embeddings (month, weekday, store) and numeric features, AdamW with "
         "two param groups built by module type (decay: Linear weights; no decay: biases, LayerNorm, embeddings), "
         "together covering every parameter.")
def tabular_groups():
    seed(0)
    g = gen(33)
    n = 2000
    cat = torch.stack([torch.randint(0, c, (n,), generator=g) for c in (12, 7, 30)], 1)
    num = torch.randn(n, 5, generator=g)
    effects = [torch.randn(c, generator=g) for c in (12, 7, 30)]
    y = sum(e[cat[:, i]] for i, e in enumerate(effects)) + num @ torch.randn(5, generator=g) * 0.5
    model = CategoricalMLP()
    decay, no_decay = [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            (decay if isinstance(module, nn.Linear) and name == "weight" else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(cat, num, y), 64, collate_fn=_tab_collate),
                loss_fn=nn.MSELoss(), max_steps=1000)


def _dice_bce(model, batch):
    img, mask = batch
    logits = model(img)
    prob = torch.sigmoid(logits.float())
    inter = (prob * mask).sum((1, 2, 3))
    dice = 1 - (2 * inter + 1) / (prob.sum((1, 2, 3)) + mask.sum((1, 2, 3)) + 1)
    return F.binary_cross_entropy_with_logits(logits.float(), mask) + dice.mean()


@healthy("ak_h_seg_dice_bce_bf16_accum",
         "Binary segmentation with a Dice + BCE loss computed in fp32 from bf16-autocast logits, precision='bf16', "
         "accumulation_steps=2, clip_grad_norm=1.0.")
def seg_dice():
    seed(0)
    g = gen(34)
    clean = F.avg_pool2d(torch.randn(640, 1, 20, 20, generator=g), 5, stride=1) * 2.5
    mask = (clean > 0.3).float()
    x = clean + 0.3 * torch.randn(clean.shape, generator=g)
    model = TinyFCN(classes=1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, mask), 16), loss_fn=_dice_bce, precision="bf16",
                accumulation_steps=2, clip_grad_norm=1.0, max_steps=800)


_ = first_token_data  # re-exported helper kept for readers of the twin
