"""Set i, healthy: 12 setups that must raise no warning or error. Ten are the corrected twin of a broken case (same
builder, the one-line fix applied); two more are unusual but correct on their own."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from benchmarks.blind_preflight_i.cases_data import (
    molecule_gin_collate_edges_without_node_offsets,
    nli_tiny_bert_pair_encoded_with_the_premise_twice,
)
from benchmarks.blind_preflight_i.cases_mechanics import nfnet_adaptive_clipping_on_zero_initialised_head
from benchmarks.blind_preflight_i.cases_shapes import (
    citation_gcn_adjacency_filled_with_edge_index_tensor,
    morse_beeps_crnn_spectrogram_time_and_frequency_swapped,
    pointset_attention_pooling_query_and_keys_swapped,
)
from benchmarks.blind_preflight_i.cases_targets import (
    bert_mlm_labels_ignored_on_the_masked_positions,
    photo_tags_multi_hot_into_multilabel_margin_loss,
)
from benchmarks.blind_preflight_i.cases_trained import (
    bars_cnn_freeze_bn_helper_freezes_every_weight,
    fraud_mlp_activation_hook_returns_detached_output,
)
from benchmarks.blind_preflight_i.registry import gen, healthy, loader, seed

# ------------------------------------------------------------- twins of broken cases (the fix applied) -------------


@healthy("citation_gcn_adjacency_indexed_by_source_and_destination",
         "dense GCN on 10-node graphs whose adjacency is filled with A[edge_index[0], edge_index[1]] = 1; node "
         "labels are the majority colour of the neighbours, CE over (B*N, 3) (twin of the edge_index-rows case)")
def citation_gcn_adjacency_indexed_by_source_and_destination():
    return citation_gcn_adjacency_filled_with_edge_index_tensor(index_pairs=True)


@healthy("morse_beeps_crnn_spectrogram_transposed_to_freq_time",
         "a CRNN on (frames, bins) spectrograms transposed to the (n_freq, time) layout it was written for: "
         "frequency pooled away, a GRU along time tells short-long from long-short beeps (twin)")
def morse_beeps_crnn_spectrogram_transposed_to_freq_time():
    return morse_beeps_crnn_spectrogram_time_and_frequency_swapped(transpose_input=True)


@healthy("pointset_attention_pooling_seed_queries_the_elements",
         "a Deep Sets encoder pooled by nn.MultiheadAttention with one learned seed as the query and the set "
         "elements as keys and values, z[:, 0] into the head (twin of the swapped query/key case)")
def pointset_attention_pooling_seed_queries_the_elements():
    return pointset_attention_pooling_query_and_keys_swapped(seed_queries=True)


@healthy("photo_tags_multilabel_margin_loss_with_index_targets",
         "a multi-label tagger trained with nn.MultiLabelMarginLoss on its documented target format: the positive "
         "tag ids first, padded with -1 (twin of the multi-hot case)")
def photo_tags_multilabel_margin_loss_with_index_targets():
    return photo_tags_multi_hot_into_multilabel_margin_loss(index_targets=True)


@healthy("bert_mlm_labels_on_masked_positions_only",
         "BertForMaskedLM from a tiny BertConfig, dynamic 15% masking in the collate, labels -100 on every unmasked "
         "position; model(**batch).loss (twin of the inverted-label case)")
def bert_mlm_labels_on_masked_positions_only():
    return bert_mlm_labels_ignored_on_the_masked_positions(ignore_unmasked=True)


@healthy("fraud_mlp_activation_hooks_returning_none",
         "an MLP with forward hooks on every ReLU that store output.detach() for dead-unit monitoring and return "
         "None, leaving the forward untouched (twin of the hook that returned the detached copy)")
def fraud_mlp_activation_hooks_returning_none():
    return fraud_mlp_activation_hook_returns_detached_output(return_stored=False)


@healthy("nfnet_adaptive_clipping_with_head_excluded",
         "a normaliser-free CNN with a zero-initialised classifier, SGD with Nesterov momentum and unit-wise "
         "adaptive gradient clipping (a step pre-hook) on every layer but the classifier (twin)")
def nfnet_adaptive_clipping_with_head_excluded():
    return nfnet_adaptive_clipping_on_zero_initialised_head(exclude_head=True)


@healthy("molecule_gin_collate_with_node_offsets",
         "a GIN on variable-size graphs batched by a hand-written collate that shifts each graph's edge_index by the "
         "nodes before it; sum read-out per graph with index_add_ (twin of the collate without offsets)")
def molecule_gin_collate_with_node_offsets():
    return molecule_gin_collate_edges_without_node_offsets(offset_nodes=True)


@healthy("nli_tiny_bert_premise_hypothesis_pairs",
         "BertForSequenceClassification from a tiny BertConfig on [CLS] premise [SEP] hypothesis [SEP] pairs with "
         "token_type_ids; model(**batch).loss (twin of the premise-twice case)")
def nli_tiny_bert_premise_hypothesis_pairs():
    return nli_tiny_bert_pair_encoded_with_the_premise_twice(second="hypothesis")


@healthy("bars_cnn_batchnorm_scales_frozen_on_purpose",
         "a BatchNorm CNN whose BatchNorm scales (gamma) are frozen on purpose with an isinstance(m, BatchNorm2d) "
         "check; every other parameter trains, the frozen ones stay in the optimizer's list (twin of the hasattr "
         "helper)")
def bars_cnn_batchnorm_scales_frozen_on_purpose():
    return bars_cnn_freeze_bn_helper_freezes_every_weight(by_type=True)


# ------------------------------------------------------------- unusual but correct -------------------------------

N_ITEMS, TEXT_D, USER_D = 300, 24, 20


def _catalog():
    g = gen(900)
    latent = torch.randn(N_ITEMS, 8, generator=g)
    text = torch.cat([latent[:, :4], torch.randn(N_ITEMS, TEXT_D - 4, generator=g)], 1)    # "pretrained" vectors
    user_map = torch.randn(8, USER_D, generator=g)
    return latent, text, user_map


def _sessions(n: int, s: int):
    latent, _, user_map = _catalog()
    g = gen(s)
    items = torch.randint(0, N_ITEMS, (n,), generator=g)
    users = latent[items] @ user_map + 0.5 * torch.randn(n, USER_D, generator=g)
    return users, items


class TwoTower(nn.Module):
    """User tower on user features; item tower on a trainable id embedding plus frozen pretrained text vectors."""

    def __init__(self, text_vectors: torch.Tensor, d: int = 32):
        super().__init__()
        self.user_tower = nn.Sequential(nn.Linear(USER_D, 64), nn.ReLU(), nn.Linear(64, d))
        self.item_id = nn.Embedding(N_ITEMS, 16)
        self.item_text = nn.Embedding.from_pretrained(text_vectors, freeze=True)
        self.item_tower = nn.Sequential(nn.Linear(16 + TEXT_D, 64), nn.ReLU(), nn.Linear(64, d))

    def forward(self, users, items):
        u = F.normalize(self.user_tower(users), dim=-1)
        v = F.normalize(self.item_tower(torch.cat([self.item_id(items), self.item_text(items)], -1)), dim=-1)
        return u, v


def in_batch_softmax(model, batch, temperature: float = 0.05):
    users, items = batch
    u, v = model(users, items)
    logits = u @ v.T / temperature
    same = items[:, None] == items[None, :]                      # the same item twice in a batch is no negative
    logits = logits.masked_fill(same & ~torch.eye(len(items), dtype=torch.bool), float("-inf"))
    return F.cross_entropy(logits, torch.arange(len(items)))


@healthy("two_tower_in_batch_negatives_frozen_text_vectors_two_lrs",
         "two-tower retrieval with in-batch softmax negatives (labels arange(B) over the (B, B) cosine logits, "
         "temperature 0.05, duplicate items masked), the item tower's pretrained text vectors frozen on purpose "
         "(from_pretrained(freeze=True), left out of the optimizer), two AdamW groups at different learning rates, "
         "clip_grad_norm=1.0, drop_last batches")
def two_tower_in_batch_negatives_frozen_text_vectors_two_lrs():
    seed(0)
    _, text, _ = _catalog()
    model = TwoTower(text)
    groups = [{"params": model.user_tower.parameters(), "lr": 2e-3},
              {"params": [p for n, p in model.named_parameters() if n.startswith("item_") and p.requires_grad],
               "lr": 5e-3}]
    train = torch.utils.data.TensorDataset(*_sessions(3000, 1))
    val = torch.utils.data.TensorDataset(*_sessions(600, 2))
    return dict(model=model, optimizer=torch.optim.AdamW(groups, weight_decay=0.01),
                train_loader=loader(train, 64, drop_last=True), val_loader=loader(val, 128, shuffle=False,
                                                                                 drop_last=True),
                loss_fn=in_batch_softmax, clip_grad_norm=1.0)


ACTIONS, MAX_LEN = 6, 14


class Sessions(Dataset):
    """Variable-length click sessions (4-14 actions, zero-padded; action ids 1..5), the next action at every step,
    whether the session ends in a purchase, and a per-session weight (0.3 for sessions from a noisy tracker)."""

    def __init__(self, n: int, s: int):
        g = gen(s)
        self.rows = []
        for _ in range(n):
            length = int(torch.randint(4, MAX_LEN + 1, (1,), generator=g))
            start = int(torch.randint(1, ACTIONS, (1,), generator=g))
            stride = int(torch.randint(1, 3, (1,), generator=g))
            acts = (start - 1 + stride * torch.arange(length + 1)) % (ACTIONS - 1) + 1
            noisy = bool(torch.rand(1, generator=g) < 0.25)
            purchase = float((acts[:length] == 5).sum() >= 2)
            self.rows.append((acts[:length], acts[1:length + 1], purchase, 0.3 if noisy else 1.0))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def pad_sessions(rows):
    lengths = torch.tensor([len(r[0]) for r in rows])
    ids = torch.zeros(len(rows), MAX_LEN, dtype=torch.long)
    nxt = torch.full((len(rows), MAX_LEN), -100)
    for k, (a, b, _, _) in enumerate(rows):
        ids[k, :len(a)], nxt[k, :len(b)] = a, b
    purchase = torch.tensor([r[2] for r in rows])
    weight = torch.tensor([r[3] for r in rows])
    return ids, lengths, nxt, purchase, weight


class SessionGRU(nn.Module):
    def __init__(self, d: int = 32):
        super().__init__()
        self.emb = nn.Embedding(ACTIONS, d, padding_idx=0)
        self.gru = nn.GRU(d, 64, batch_first=True)
        self.next_action = nn.Linear(64, ACTIONS)
        self.purchase = nn.Linear(64, 1)

    def forward(self, ids, lengths):
        out, _ = self.gru(self.emb(ids))
        last = out[torch.arange(len(ids)), lengths - 1]            # the last real step of each session
        return self.next_action(out), self.purchase(last).squeeze(-1)


def session_loss(model, batch):
    ids, lengths, nxt, purchase, weight = batch
    step_logits, purchase_logit = model(ids, lengths)
    tagging = F.cross_entropy(step_logits.reshape(-1, ACTIONS), nxt.reshape(-1), ignore_index=-100,
                              label_smoothing=0.1)
    per_session = F.binary_cross_entropy_with_logits(purchase_logit, purchase, reduction="none")
    return tagging + (weight * per_session).sum() / weight.sum()


@healthy("session_gru_padded_next_action_and_purchase_heads",
         "a GRU over zero-padded variable-length sessions with two heads: next action at every step (CE with "
         "ignore_index=-100 on the padding, label_smoothing=0.1) and purchase read at each session's last real "
         "step (BCE with per-session weights normalised by their sum); accumulation_steps=2, a SequentialLR "
         "warmup + cosine schedule")
def session_gru_padded_next_action_and_purchase_heads():
    seed(0)
    model = SessionGRU()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=20)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=280, eta_min=1e-4)
    scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, cosine], milestones=[20])
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, max_steps=300, accumulation_steps=2,
                train_loader=loader(Sessions(1500, 1), 32, collate_fn=pad_sessions),
                val_loader=loader(Sessions(300, 2), 100, shuffle=False, collate_fn=pad_sessions),
                loss_fn=session_loss)
