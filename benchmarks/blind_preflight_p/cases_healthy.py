"""Healthy cases: 5 corrected twins of broken cases (the same builder with the one-line fix) and 5 unusual but correct
real-world setups. None should raise a warning."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset, TensorDataset, WeightedRandomSampler

from benchmarks.blind_preflight_p.cases_data import citations_gcn_no_self_loops
from benchmarks.blind_preflight_p.cases_mechanics import reviews_schedule_total_is_epochs
from benchmarks.blind_preflight_p.cases_shapes import peptide_transformer_seq_first
from benchmarks.blind_preflight_p.cases_targets import crack_mask_normalized
from benchmarks.blind_preflight_p.cases_trained import movies_from_pretrained_frozen
from benchmarks.blind_preflight_p.registry import gen, healthy, loader, seed, split, twin

# --------------------------------------------------------------------------------------------------------------------
# The corrected twins.

healthy("healthy_peptide_transformer_batch_first",
        "The peptide transformer built with batch_first=True, so attention runs along each peptide and [CLS] pools "
        "its own residues.")(twin(peptide_transformer_seq_first))
healthy("healthy_crack_mask_kept_binary",
        "Crack segmentation with the image normalised and the mask left in {0, 1} for BCEWithLogitsLoss.")(
    twin(crack_mask_normalized))
healthy("healthy_movies_embeddings_fine_tuned",
        "Movie embeddings initialised from content vectors with from_pretrained(..., freeze=False) and fine-tuned "
        "with the viewer vectors.")(twin(movies_from_pretrained_frozen))
healthy("healthy_reviews_schedule_in_steps",
        "Tiny BERT (from a config) with a linear warm-up/decay schedule counted in optimizer steps "
        "(EPOCHS * len(train_loader)), stepped per batch.")(twin(reviews_schedule_total_is_epochs))
healthy("healthy_citations_gcn_self_loops",
        "Full-batch GCN whose normalised adjacency includes self-loops (A + I).")(twin(citations_gcn_no_self_loops))

# --------------------------------------------------------------------------------------------------------------------
# 1. A tiny GPT-2 built from a config on right-padded batches: attention_mask, padding labelled -100.

GPT_VOCAB = 24


class PaddedProgressions(Dataset):
    """Token progressions of 6-16 tokens (ids 3..23) padded later by the collate; 0 is the pad id."""

    def __init__(self, n: int, s: int):
        g = gen(s)
        self.rows = []
        for _ in range(n):
            length = int(torch.randint(6, 17, (1,), generator=g))
            start = int(torch.randint(0, GPT_VOCAB - 3, (1,), generator=g))
            step = int(torch.randint(1, 4, (1,), generator=g))
            self.rows.append((start + step * torch.arange(length)) % (GPT_VOCAB - 3) + 3)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def lm_collate(rows):
    ids = pad_sequence(rows, batch_first=True, padding_value=0)
    mask = (ids != 0).long()
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@healthy("healthy_gpt2_padded_progressions",
         "A 2-layer GPT-2 built from GPT2Config (no download) on right-padded batches with attention_mask and pad "
         "positions labelled -100; AdamW, cosine schedule with warm-up in steps, clipping 1.0; loss model(**batch).loss.")
def gpt2_padded_progressions() -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel, get_cosine_schedule_with_warmup
    seed(0)
    config = GPT2Config(vocab_size=GPT_VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    max_steps = 400
    return dict(model=model, optimizer=optimizer,
                scheduler=get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=20, num_training_steps=max_steps),
                train_loader=loader(PaddedProgressions(1600, 31), 32, collate_fn=lm_collate),
                val_loader=loader(PaddedProgressions(200, 32), 50, False, collate_fn=lm_collate),
                max_steps=max_steps, clip_grad_norm=1.0)


# --------------------------------------------------------------------------------------------------------------------
# 2. Session-based next-category prediction with a packed GRU over variable-length sessions.

N_CATEGORIES = 12


class Sessions(Dataset):
    """Browsing sessions of 3-15 category ids (1..12, 0 = pad); the next category is the last one + 1 (cyclic)."""

    def __init__(self, n: int, s: int):
        g = gen(s)
        self.rows = []
        for _ in range(n):
            length = int(torch.randint(3, 16, (1,), generator=g))
            self.rows.append(torch.randint(1, N_CATEGORIES + 1, (length,), generator=g))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        return row, int(row[-1] % N_CATEGORIES)


def session_collate(items):
    rows, targets = zip(*items)
    return (pad_sequence(list(rows), batch_first=True), torch.tensor([len(r) for r in rows]),
            torch.tensor(targets))


class SessionGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(N_CATEGORIES + 1, 16, padding_idx=0)
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.out = nn.Linear(32, N_CATEGORIES)

    def forward(self, padded, lengths):
        packed = pack_padded_sequence(self.emb(padded), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h_n = self.gru(packed)
        return self.out(h_n[-1])


def session_loss(model, batch):
    padded, lengths, target = batch
    return F.cross_entropy(model(padded, lengths), target)


@healthy("healthy_sessions_packed_gru",
         "Next-category prediction from variable-length browsing sessions: pack_padded_sequence(enforce_sorted=False) "
         "with CPU lengths, the GRU's final hidden state, a custom loss_fn(model, batch).")
def sessions_packed_gru() -> dict:
    seed(0)
    model = SessionGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(Sessions(2000, 33), 64, collate_fn=session_collate),
                val_loader=loader(Sessions(300, 34), 100, False, collate_fn=session_collate),
                loss_fn=session_loss, max_steps=1500)


# --------------------------------------------------------------------------------------------------------------------
# 3. Multi-task leaf CNN in bf16: disease class and severity from one backbone, a weighted two-term loss.


def _leaves(n: int, s: int):
    g = gen(s)
    disease = torch.randint(0, 3, (n,), generator=g)
    severity = torch.rand(n, generator=g)
    tint = torch.tensor([[0.2, 0.6, 0.2], [0.5, 0.5, 0.1], [0.4, 0.3, 0.2]])[disease]
    img = tint[:, :, None, None] + 0.1 * torch.randn(n, 3, 16, 16, generator=g)
    spots = (torch.rand(n, 1, 16, 16, generator=g) < severity[:, None, None, None] * 0.5).float()
    img = img - 0.3 * spots
    return img, disease, severity


class LeafNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                      nn.Flatten())
        self.disease_head = nn.Linear(32, 3)
        self.severity_head = nn.Linear(32, 1)

    def forward(self, img):
        h = self.backbone(img)
        return self.disease_head(h), self.severity_head(h).squeeze(1)


def leaf_loss(model, batch):
    img, disease, severity = batch
    logits, sev = model(img)
    return F.cross_entropy(logits.float(), disease) + 2.0 * F.mse_loss(sev.float(), severity)


@healthy("healthy_leaves_multitask_bf16",
         "A two-head leaf CNN (disease classification + severity regression) trained in bf16 autocast with a weighted "
         "sum of cross-entropy and MSE computed in float32.")
def leaves_multitask_bf16() -> dict:
    seed(0)
    img, disease, severity = _leaves(1500, 35)
    n = 1200
    model = LeafNet()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4),
                train_loader=loader(TensorDataset(img[:n], disease[:n], severity[:n]), 32),
                val_loader=loader(TensorDataset(img[n:], disease[n:], severity[n:]), 100, False),
                loss_fn=leaf_loss, precision="bf16", max_steps=2000)


# --------------------------------------------------------------------------------------------------------------------
# 4. Spectra with a frozen PCA projection, two learning-rate groups and a OneCycle schedule stepped per batch.


def _spectra(n: int, s: int):
    g = gen(s)
    wavelengths = torch.linspace(0, 1, 80)
    peaks = torch.tensor([0.2, 0.35, 0.5, 0.65, 0.8])
    y = torch.randint(0, 5, (n,), generator=g)
    x = torch.exp(-((wavelengths[None] - peaks[y][:, None]) / 0.05) ** 2)
    x = x + 0.3 * torch.exp(-((wavelengths[None] - 0.1 - 0.8 * torch.rand(n, 1, generator=g)) / 0.08) ** 2)
    return x + 0.05 * torch.randn(n, 80, generator=g), y


class SpectraNet(nn.Module):
    def __init__(self, components: torch.Tensor, mean: torch.Tensor):
        super().__init__()
        self.pca = nn.Linear(80, 24)                  # a fixed PCA projection fitted on the training spectra
        with torch.no_grad():
            self.pca.weight.copy_(components)
            self.pca.bias.copy_(-components @ mean)
        self.pca.requires_grad_(False)
        self.body = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 5)

    def forward(self, x):
        return self.head(self.body(self.pca(x)))


@healthy("healthy_spectra_frozen_pca_two_lr_onecycle",
         "Spectral classifier whose first layer is a deliberately frozen PCA projection (excluded from the optimizer), "
         "body and head in two AdamW groups (lr 1e-3 / 1e-2) under OneCycleLR stepped every batch over max_steps.")
def spectra_frozen_pca_two_lr_onecycle() -> dict:
    seed(0)
    x, y = _spectra(2000, 36)
    (xt, yt), (xv, yv) = split(x, y, 1700)
    mean = xt.mean(0)
    _, _, v = torch.linalg.svd(xt - mean, full_matrices=False)
    model = SpectraNet(v[:24], mean)
    max_steps = 600
    optimizer = torch.optim.AdamW([{"params": model.body.parameters(), "lr": 1e-3},
                                   {"params": model.head.parameters(), "lr": 1e-2}], weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=[1e-3, 1e-2], total_steps=max_steps)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(xt, yt), 32), val_loader=loader(TensorDataset(xv, yv), 150, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=max_steps)


# --------------------------------------------------------------------------------------------------------------------
# 5. Rare-fault detection: a per-sample WeightedRandomSampler, 4-step accumulation, label smoothing, Nesterov SGD.


def _faults(n: int, s: int):
    g = gen(s)
    y = (torch.rand(n, generator=g) < 0.06).long()
    x = torch.randn(n, 14, generator=g)
    x[:, :3] += 1.8 * y[:, None]
    x[:, 3] += torch.where(y > 0, 1.0, 0.0) * x[:, 4]
    return x, y


@healthy("healthy_faults_weighted_sampler_accumulation",
         "Rare pump faults (6%): a WeightedRandomSampler with per-sample inverse-frequency weights (replacement=True), "
         "4-step gradient accumulation, CrossEntropyLoss(label_smoothing=0.05), Nesterov SGD with a cosine schedule "
         "over max_steps and clipping.")
def faults_weighted_sampler_accumulation() -> dict:
    seed(0)
    x, y = _faults(4000, 37)
    (xt, yt), (xv, yv) = split(x, y, 3400)
    counts = torch.bincount(yt, minlength=2).float()
    weights = (1.0 / counts)[yt]                      # one weight per sample
    sampler = WeightedRandomSampler(weights, num_samples=len(yt), replacement=True,
                                    generator=torch.Generator().manual_seed(7))
    model = nn.Sequential(nn.Linear(14, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    max_steps = 800
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max_steps),
                train_loader=DataLoader(TensorDataset(xt, yt), batch_size=32, sampler=sampler),
                val_loader=loader(TensorDataset(xv, yv), 200, False),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.05), accumulation_steps=4, clip_grad_norm=5.0,
                max_steps=max_steps)
