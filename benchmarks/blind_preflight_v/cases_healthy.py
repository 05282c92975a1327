"""Healthy: five corrected twins of broken cases and five unusual but correct setups. None should raise anything."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset
from transformers import WhisperConfig, WhisperForConditionalGeneration, get_linear_schedule_with_warmup

from benchmarks.blind_preflight_v.cases_data import ner_unaligned
from benchmarks.blind_preflight_v.cases_mechanics import noam_small_lr
from benchmarks.blind_preflight_v.cases_shapes import gru_view
from benchmarks.blind_preflight_v.cases_targets import GAMMA, _corridor, _phone_frames, clip_zeros
from benchmarks.blind_preflight_v.cases_trained import item_frozen
from benchmarks.blind_preflight_v.registry import gen, healthy, loader, seed, twin

# --------------------------------------------------------------------------- the corrected twins
healthy("gru_final_states_permuted", "twin of gru_final_states_view_mixes_samples: h_n.permute(1, 0, 2).reshape(B, -1) "
        "keeps each sample's two layer states together")(twin(gru_view))
healthy("clip_labels_arange", "twin of clip_labels_zeros_on_in_batch_matrix: labels = torch.arange(batch), the "
        "diagonal of the in-batch similarity matrix")(twin(clip_zeros))
healthy("item_table_from_pretrained_trainable", "twin of item_table_from_pretrained_frozen: "
        "nn.Embedding.from_pretrained(init, freeze=False)")(twin(item_frozen))
healthy("noam_lambda_base_lr_one", "twin of noam_lambda_times_small_base_lr: Adam(lr=1.0) so the Noam lambda is the "
        "learning rate")(twin(noam_small_lr))
healthy("ner_tags_aligned_to_first_piece", "twin of ner_word_tags_not_aligned_to_pieces: tag on each word's first "
        "piece, -100 on [CLS], continuation pieces and padding")(twin(ner_unaligned))


# --------------------------------------------------------------------------- H1: tiny Whisper from a config
class ToneTranscripts(Dataset):
    """(16 mel bins, 32 frames) clips holding 2-4 tones in a row; the transcript names each tone's band."""

    def __init__(self, n, g):
        self.items = []
        mel = torch.arange(16, dtype=torch.float32)
        for _ in range(n):
            k = int(torch.randint(2, 5, (1,), generator=g))
            bands = torch.randint(0, 6, (k,), generator=g)
            spec = 0.1 * torch.randn(16, 32, generator=g)
            t = 1
            for b in bands.tolist():
                d = 5 + int(torch.randint(0, 3, (1,), generator=g))
                spec[:, t:t + d] += torch.exp(-0.5 * ((mel - (1.5 + 2.5 * b)) / 0.8) ** 2)[:, None]
                t += d + 1
            labels = torch.full((6,), -100)
            labels[:k] = bands + 3
            labels[k] = 1                                 # eos
            self.items.append({"input_features": spec, "labels": labels})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


@healthy("whisper_tiny_from_config_transcripts", "a Whisper encoder-decoder built from a config (no download) on "
         "synthetic log-mel clips, labels padded with -100 and shifted by the model, linear warm-up sized in "
         "optimizer steps")
def whisper_tiny():
    seed(0)
    g = gen(51)
    model = WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=12, num_mel_bins=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16,
        max_target_positions=16, pad_token_id=0, bos_token_id=2, eos_token_id=1, decoder_start_token_id=2,
        suppress_tokens=None, begin_suppress_tokens=None))
    train = loader(ToneTranscripts(800, g), 32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    steps = 300
    return dict(model=model, optimizer=optimizer, train_loader=train,
                val_loader=loader(ToneTranscripts(200, g), 100, shuffle=False),
                scheduler=get_linear_schedule_with_warmup(optimizer, 30, steps), loss_fn=None, max_steps=steps)


# --------------------------------------------------------------------------- H2: two-tower, in-batch softmax + logQ
class Retrieval(nn.Module):
    def __init__(self, n_users=400, n_items=300, d=32):
        super().__init__()
        self.user = nn.Embedding(n_users, d)
        self.item = nn.Embedding(n_items, d)
        self.user_mlp = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
        self.log_temp = nn.Parameter(torch.tensor(2.0))

    def forward(self, users, items):
        u = F.normalize(self.user_mlp(self.user(users)), dim=-1)
        v = F.normalize(self.item(items), dim=-1)
        return u, v, self.log_temp.clamp(0.0, 4.0).exp()


def _inbatch_logq(model, batch):
    users, items, log_q = batch
    u, v, scale = model(users, items)
    logits = scale * u @ v.T - log_q[None, :]           # sampled-softmax correction for popular items
    labels = torch.arange(len(users), device=logits.device)
    return F.cross_entropy(logits, labels)


@healthy("two_tower_inbatch_softmax_logq", "two-tower retrieval trained with in-batch sampled softmax, a logQ "
         "popularity correction, a clamped learnable temperature and AdamW groups without decay on embeddings")
def two_tower():
    seed(0)
    g = gen(52)
    ug = torch.randint(0, 8, (400,), generator=g)
    pop = 1.0 / torch.arange(1, 301).float() ** 0.8
    ig = torch.randperm(300, generator=g) % 8
    users = torch.randint(0, 400, (6000,), generator=g)
    weights = pop[None, :] * (ig[None, :] == ug[users][:, None]).float()
    items = torch.multinomial(weights, 1, generator=g).squeeze(1)
    q = pop / pop.sum()
    model = Retrieval()
    emb = [model.user.weight, model.item.weight]
    rest = [p for n, p in model.named_parameters() if n not in ("user.weight", "item.weight")]
    optimizer = torch.optim.AdamW([{"params": emb, "weight_decay": 0.0}, {"params": rest, "weight_decay": 1e-4}],
                                  lr=1e-2)
    data = TensorDataset(users, items, q[items].log())
    return dict(model=model, optimizer=optimizer, train_loader=loader(data, 128), loss_fn=_inbatch_logq,
                max_steps=300)


# --------------------------------------------------------------------------- H3: TD with a frozen target network
@healthy("td_frozen_target_net_outside_model", "TD(0) value regression with a done mask, Huber loss and clipping, "
         "bootstrapping from a frozen copy of the network held by the loss (refreshed between runs, not trained)")
def td_target_net():
    seed(0)
    s, r, s2, d = _corridor(300, gen(53))
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    target_net = copy.deepcopy(model).requires_grad_(False)

    def loss_fn(m, batch):
        s, r, s2, done = batch
        target_net.to(s2.device)
        with torch.no_grad():
            target = r + GAMMA * target_net(s2).squeeze(-1) * (1 - done)
        return F.smooth_l1_loss(m(s).squeeze(-1), target)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(s, r, s2, d), 64), loss_fn=loss_fn, clip_grad_norm=10.0,
                max_steps=300)


# --------------------------------------------------------------------------- H4: RevIN multi-horizon forecaster
class RevINForecaster(nn.Module):
    def __init__(self, window=32, horizon=4):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(window, 64), nn.ReLU(), nn.Linear(64, horizon))

    def forward(self, x):                               # x: (batch, window); statistics of the inputs only
        mu, sd = x.mean(1, keepdim=True), x.std(1, keepdim=True) + 1e-5
        return self.mlp((x - mu) / sd) * sd + mu


@healthy("revin_forecaster_onecycle", "multi-horizon forecaster normalising each window by its inputs' own "
         "statistics (RevIN) and de-normalising the (batch, 4) output, OneCycleLR per batch over max_steps, clipping")
def revin():
    seed(0)
    g = gen(54)
    t = torch.arange(36, dtype=torch.float32)
    f = 0.03 + 0.06 * torch.rand(1600, 1, generator=g)
    s = (2 + torch.rand(1600, 1, generator=g)) * torch.sin(6.283 * f * t + 6.283 * torch.rand(1600, 1, generator=g))
    s = s + 10 * torch.randn(1600, 1, generator=g) + 0.05 * torch.randn(1600, 36, generator=g)
    model = RevINForecaster()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps = 300
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(s[:1300, :32], s[:1300, 32:]), 32),
                val_loader=loader(TensorDataset(s[1300:, :32], s[1300:, 32:]), 100, shuffle=False),
                loss_fn=nn.MSELoss(), clip_grad_norm=1.0, max_steps=steps)


# --------------------------------------------------------------------------- H5: CTC done right, variable lengths
class BiGRUTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(12, 48, batch_first=True, bidirectional=True)
        self.out = nn.Linear(96, 9)

    def forward(self, x):
        h, _ = self.gru(x)
        return self.out(h).log_softmax(-1)


def _ctc_varlen(model, batch):
    x, labels, in_len, tgt_len = batch
    log_probs = model(x).transpose(0, 1)                 # (time, batch, classes)
    return F.ctc_loss(log_probs, labels, in_len, tgt_len, blank=0, zero_infinity=True)


@healthy("ctc_log_softmax_variable_lengths", "CTC on log_softmax outputs of a bidirectional GRU, padded targets with "
         "per-sample input and target lengths, zero_infinity, accumulation over 2 micro-batches")
def ctc_varlen():
    seed(0)
    g = gen(55)
    protos = torch.randn(9, 12, generator=g)
    x, labels = _phone_frames(1000, g, protos)
    tgt_len = torch.randint(3, 6, (1000,), generator=g)
    labels = labels.masked_fill(torch.arange(5)[None] >= tgt_len[:, None], 0)
    in_len = torch.full((1000,), 24, dtype=torch.long)
    model = BiGRUTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, labels, in_len, tgt_len), 16), loss_fn=_ctc_varlen,
                accumulation_steps=2, max_steps=150)
