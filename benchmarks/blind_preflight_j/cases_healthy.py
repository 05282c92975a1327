"""Set j, healthy cases: seven corrected twins of broken cases (the same builder with the one-line fix, several of them
unusual but correct) and three unusual-but-correct setups of real-world shape. All must learn and raise nothing."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_j import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_j.registry import gen, healthy, loader, seed, twin

# --------------------------------------------------------------------------------------------------------------------
# the corrected twins

healthy("shop_mf_einsum_dot_product", "matrix factorisation recommender with torch.einsum('bd,bd->b', user, item) plus "
        "user and item biases, (user, item, rating) batches, MSE; Adam")(
    twin(cases_shapes.shop_mf_einsum_factor_axis_not_contracted))

healthy("deepsurv_cox_risk_sets_descending", "DeepSurv-style Cox partial likelihood: the batch sorted by "
        "torch.argsort(time, descending=True), logcumsumexp risk sets, censored rows contributing only to risk sets")(
    twin(cases_targets.deepsurv_cox_risk_sets_sorted_ascending))

healthy("blob_keypoint_heatmap_sigma_in_pixels", "CenterNet-style keypoint heatmaps with sigma=1.5 pixels on the 24x24 "
        "pixel grid, sub-pixel centres, a fully convolutional net and MSE on the heatmaps")(
    twin(cases_targets.blob_keypoint_heatmap_sigma_in_normalised_units))

healthy("ode_pinn_derivative_with_create_graph", "a physics-informed MLP: the loss differentiates the output with "
        "torch.autograd.grad(..., create_graph=True) on inputs that require grad, residual plus boundary term; "
        "no validation loader")(twin(cases_mechanics.ode_pinn_derivative_without_create_graph))

healthy("chain_td_value_semi_gradient", "TD(0) policy evaluation on logged transitions: mse(V(s), r + gamma * "
        "V(s').detach()), the semi-gradient with the bootstrap target detached; state features kept in a buffer")(
    twin(cases_mechanics.chain_td_value_stop_gradient_on_wrong_side))

healthy("marker_order_transformer_learned_positions_from_zero", "a pre-norm transformer whose learned position table "
        "starts at zeros (nn.Parameter, requires_grad=True) and learns whether marker A precedes marker B")(
    twin(cases_trained.marker_order_transformer_position_table_frozen_at_zero))

healthy("tones_stft_preprocessed_features", "short tone bursts turned into log-magnitude STFT features once, as "
        "preprocessing (n_fft=512, hop_length=128, max over frames), standardised with the training split's "
        "statistics; MLP classifier")(twin(cases_data.tones_stft_n_fft_and_hop_length_swapped))


# --------------------------------------------------------------------------------------------------------------------
# 8. variable-length sessions: packed GRU (lengths on the CPU), two heads, a summed two-task loss

V_SES = 40


class Sessions(Dataset):
    """Event-id sessions of 3-25 events: the class is the most frequent of 4 'intent' events (ids 1-4), the
    regression target the session's share of 'purchase' events (id 5)."""

    def __init__(self, n, s):
        g = gen(s)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(3, 26, (1,), generator=g))
            y = int(torch.randint(0, 4, (1,), generator=g))
            ev = torch.randint(5, V_SES, (length,), generator=g)
            hits = torch.rand(length, generator=g) < 0.4
            ev[hits] = 1 + y
            share = (ev == 5).float().mean()
            self.items.append((ev, y, share))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate_sessions(batch):
    seqs = [b[0] for b in batch]
    return (pad_sequence(seqs, batch_first=True), torch.tensor([len(s) for s in seqs]),
            torch.tensor([b[1] for b in batch]), torch.stack([b[2] for b in batch]))


class SessionGRU(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.emb = nn.Embedding(V_SES, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.intent = nn.Linear(d, 4)
        self.share = nn.Linear(d, 1)

    def forward(self, ev, lengths):
        packed = pack_padded_sequence(self.emb(ev), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h = self.gru(packed)
        return self.intent(h[-1]), self.share(h[-1]).squeeze(-1)


def session_two_task_loss(model, batch):
    ev, lengths, intent, share = batch
    logits, pred_share = model(ev, lengths)
    return F.cross_entropy(logits, intent) + 5.0 * F.mse_loss(pred_share, share)


@healthy("sessions_packed_gru_intent_and_share_two_heads",
         "variable-length sessions padded with pad_sequence(batch_first=True), pack_padded_sequence(lengths.cpu(), "
         "enforce_sorted=False) into a GRU, the last hidden state into an intent head (CE) and a purchase-share head "
         "((B,) vs (B,) MSE), the two losses summed")
def sessions_packed_gru_intent_and_share_two_heads():
    seed(0)
    model = SessionGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(Sessions(1600, 210), 32, collate_fn=collate_sessions),
                val_loader=loader(Sessions(400, 211), 100, shuffle=False, collate_fn=collate_sessions),
                loss_fn=session_two_task_loss, clip_grad_norm=1.0, max_steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 9. tiny BERT token classification from a config, -100 on [CLS], [SEP] and padding


class TaggedSentences(Dataset):
    """[CLS] tokens [SEP] [PAD]...; the tag of a token is (id mod 3), or 3 when the previous token is the id 7."""

    def __init__(self, n, s, max_len=18, vocab=60):
        g = gen(s)
        self.rows = []
        for _ in range(n):
            length = int(torch.randint(4, max_len - 1, (1,), generator=g))
            tok = torch.randint(5, vocab, (length,), generator=g)
            tags = tok % 3
            tags[1:][tok[:-1] == 7] = 3
            ids = torch.zeros(max_len, dtype=torch.long)
            labels = torch.full((max_len,), -100)
            ids[0], ids[1:length + 1], ids[length + 1] = 2, tok, 3         # [CLS]=2, [SEP]=3, [PAD]=0
            labels[1:length + 1] = tags
            mask = (torch.arange(max_len) < length + 2).long()
            self.rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


@healthy("tiny_bert_token_classification_minus100_specials",
         "BertForTokenClassification built from a tiny BertConfig (no download), num_labels=4, padded sentences with "
         "attention_mask and labels -100 on [CLS], [SEP] and padding; loss is model(**batch).loss")
def tiny_bert_token_classification_minus100_specials():
    from transformers import BertConfig, BertForTokenClassification

    seed(0)
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, num_labels=4, pad_token_id=0)
    model = BertForTokenClassification(config)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(TaggedSentences(1200, 220), 32),
                val_loader=loader(TaggedSentences(300, 221), 100, shuffle=False),
                loss_fn=None, max_steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 10. a stem loaded from a fixed state dict and frozen on purpose, two LR groups, a zero-initialised ReZero gate


class Stem(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 48)
        self.norm = nn.LayerNorm(48)

    def forward(self, x):
        return torch.tanh(self.norm(self.proj(x)))


class ReZeroBlock(nn.Module):
    def __init__(self, d=48):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(d, 96), nn.GELU(), nn.Linear(96, d))
        self.alpha = nn.Parameter(torch.zeros(1))          # ReZero: the residual branch starts switched off

    def forward(self, h):
        return h + self.alpha * self.f(h)


class StemClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = Stem()
        self.blocks = nn.Sequential(ReZeroBlock(), ReZeroBlock())
        self.head = nn.Linear(48, 5)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def _stem_state_and_data(n=3000, s=230):
    torch.manual_seed(231)
    state = {k: v.clone() for k, v in Stem().state_dict().items()}  # the 'pretrained' stem, fixed and seeded
    reference = Stem()
    reference.load_state_dict(state)
    g = gen(s)
    x = torch.randn(n, 16, generator=g)
    with torch.no_grad():
        f = reference(x)
    y = (torch.tanh(f @ torch.randn(48, 24, generator=g)) @ torch.randn(24, 5, generator=g)).argmax(1)
    return state, x, y


@healthy("stem_loaded_frozen_two_lr_groups_rezero_blocks",
         "a stem loaded strictly from a fixed state dict and frozen on purpose (requires_grad_(False), left out of the "
         "optimizer), ReZero residual blocks whose gate alpha starts at 0, and AdamW with two groups: blocks at 1e-3, "
         "the new head at 3e-3")
def stem_loaded_frozen_two_lr_groups_rezero_blocks():
    seed(0)
    state, x, y = _stem_state_and_data()
    model = StemClassifier()
    model.stem.load_state_dict(state, strict=True)
    model.stem.requires_grad_(False)
    optimizer = torch.optim.AdamW([{"params": model.blocks.parameters(), "lr": 1e-3},
                                   {"params": model.head.parameters(), "lr": 3e-3}], weight_decay=0.01)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 64),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)
