"""Set h, healthy setups: real-world shapes that must stay quiet (several are the correct twin of a broken case)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_h import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_h.registry import gen, healthy, loader, seed, token_sequences


@healthy("speaker_supcon_outer_label_mask",
         "supervised-contrastive speaker embeddings (MLP, normalised) with the positive mask "
         "labels[:, None] == labels[None, :] minus the diagonal, temperature 0.2, drop_last batches of 64")
def speaker_supcon_outer_label_mask():
    return cases_shapes._speaker(True)


@healthy("blob_softargmax_meshgrid_ij_grids",
         "a fully convolutional keypoint net with a soft-argmax read-out whose grids come from "
         "torch.meshgrid(ys, xs, indexing='ij') (gy, gx), MSE on (x, y) targets in [-1, 1]")
def blob_softargmax_meshgrid_ij_grids():
    return cases_shapes._blob(False)


@healthy("annotations_per_sample_weighted_cross_entropy",
         "per-sample weights (0 for an unreliable annotator's rows) applied to CrossEntropyLoss(reduction='none') "
         "and normalised by the batch's weight sum")
def annotations_per_sample_weighted_cross_entropy():
    return cases_targets._weak(True)


@healthy("spectra_frozen_loaded_backbone_head_only_init",
         "a pretrained encoder loaded with load_state_dict and frozen on purpose (requires_grad_(False), left out "
         "of the optimizer); the wrapper initialises only its new MLP head, which Adam trains")
def spectra_frozen_loaded_backbone_head_only_init():
    return cases_trained._frozen(False)


@healthy("plant_sensors_bf16_standardised_inputs",
         "precision='bf16' (autocast on CPU) for an MLP on pressure readings standardised with the train-set "
         "mean and std")
def plant_sensors_bf16_standardised_inputs():
    return cases_mechanics._bf16(True)


@healthy("defect_windows_buffer_cloned_per_item",
         "a Dataset that fills a preallocated buffer per item, removes the DC offset in place and returns "
         "self._buf.clone(), so every collated row is its own window")
def defect_windows_buffer_cloned_per_item():
    return cases_data._buffer(True)


@healthy("gauges_linear_decay_with_accumulation",
         "SGD with momentum, a LambdaLR linear decay over max_steps stepped once per optimizer step (the loss "
         "function only computes the loss), accumulation_steps=4 over micro-batches of 16")
def gauges_linear_decay_with_accumulation():
    return cases_mechanics._sched_in_loss(False)


@healthy("tabular_ntxent_concatenated_views",
         "SimCLR-style NT-Xent on tabular rows: two masked+noised views, torch.cat([z1, z2]) with labels "
         "(arange(2B) + B) % 2B, the self-similarity masked out, batches with drop_last")
def tabular_ntxent_concatenated_views():
    return cases_shapes._ntxent(False)


@healthy("fraud_bce_pos_weight_neg_over_pos",
         "a 4%-positive fraud MLP with (B,) logits into BCEWithLogitsLoss(pos_weight=n_neg / n_pos)")
def fraud_bce_pos_weight_neg_over_pos():
    return cases_targets._fraud(False)


# --------------------------------------------------------------------------------------------------------------


def variable_tickets(n, s):
    g = gen(s)
    lengths = torch.randint(4, 15, (n,), generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.zeros(n, 14, dtype=torch.long)
    for i in range(n):
        L = int(lengths[i])
        x[i, :L] = torch.randint(4, 30, (L,), generator=g)
        x[i, int(torch.randint(0, L, (), generator=g))] = 1 + y[i]          # the routing keyword
    return x, lengths, y


class PackedBiGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 16, padding_idx=0)
        self.gru = nn.GRU(16, 32, batch_first=True, bidirectional=True)
        self.head = nn.Linear(64, 3)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(self.emb(x), lengths, batch_first=True, enforce_sorted=False)
        _, h_n = self.gru(packed)                              # (2, B, 32): last valid step of each direction
        return self.head(torch.cat([h_n[0], h_n[1]], dim=1))


def packed_ce(model, batch):
    x, lengths, y = batch
    return F.cross_entropy(model(x, lengths), y)


@healthy("tickets_packed_bigru_final_states",
         "variable-length tickets (4-14 tokens, zero-padded) packed with pack_padded_sequence(enforce_sorted=False) "
         "into a bidirectional GRU; the head reads h_n of both directions; loss_fn(model, batch)")
def tickets_packed_bigru_final_states():
    seed(0)
    x, lengths, y = variable_tickets(1536, 401)
    vx, vl, vy = variable_tickets(256, 402)
    model = PackedBiGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, lengths, y), 32),
                val_loader=loader(TensorDataset(vx, vl, vy), 128, shuffle=False), loss_fn=packed_ce, max_steps=300)


@healthy("gpt2_tiny_decay_and_no_decay_groups",
         "GPT2LMHeadModel from a tiny GPT2Config (tied embeddings untouched), AdamW with two groups: weight "
         "decay 0.1 on matrices (ndim >= 2), none on biases and LayerNorm; labels = input_ids; model(**batch).loss")
def gpt2_tiny_decay_and_no_decay_groups():
    from transformers import GPT2Config, GPT2LMHeadModel
    seed(0)
    config = GPT2Config(vocab_size=40, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=1,
                        eos_token_id=2)
    model = GPT2LMHeadModel(config)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    ids = token_sequences(1024, 16, 40, s=411)
    ds = [{"input_ids": r, "attention_mask": torch.ones_like(r), "labels": r} for r in ids]
    collate = lambda b: {k: torch.stack([e[k] for e in b]) for k in b[0]}  # noqa: E731
    return dict(model=model, optimizer=torch.optim.AdamW(groups, lr=3e-3), train_loader=loader(ds, 32, collate_fn=collate),
                loss_fn=None, max_steps=300)


@healthy("keyword_cnn_warmup_cosine_label_smoothing",
         "a Conv1d keyword spotter on (B, 8 mel bands, 32 frames), AdamW at 1e-3 with SequentialLR(LinearLR warmup "
         "30 steps, CosineAnnealingLR to eta_min=1e-5), CrossEntropyLoss(label_smoothing=0.1), clip_grad_norm=1.0")
def keyword_cnn_warmup_cosine_label_smoothing():
    seed(0)
    x, y = cases_mechanics.clips(1536, 421)
    vx, vy = cases_mechanics.clips(512, 422)
    model = cases_mechanics.keyword_cnn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.05, total_iters=30)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=270, eta_min=1e-5)
    scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, cosine], milestones=[30])
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1), clip_grad_norm=1.0, max_steps=300)
