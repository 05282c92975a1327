"""Set m, healthy cases: 5 corrected twins of broken cases and 5 unusual but correct setups. None deserves a
warning; each must learn (sanity.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader, Dataset, TensorDataset, WeightedRandomSampler

from benchmarks.blind_preflight_m.cases_data import data_seg_flip_not_joint
from benchmarks.blind_preflight_m.cases_mechanics import mech_schedule_total_is_epochs
from benchmarks.blind_preflight_m.cases_shapes import shapes_seg_view_nchw
from benchmarks.blind_preflight_m.cases_targets import targets_contrastive_label_flipped
from benchmarks.blind_preflight_m.cases_trained import trained_head_swapped_after_optimizer
from benchmarks.blind_preflight_m.registry import gen, healthy, loader, seed, twin

# ---- corrected twins ------------------------------------------------------------------------------------------

healthy("healthy_seg_logits_permuted", "FCN segmentation whose logits are permuted to (N, H, W, C) before the "
        "flattened cross-entropy.")(twin(shapes_seg_view_nchw))
healthy("healthy_siamese_label_convention", "Siamese signature verifier whose contrastive loss uses the dataset's "
        "own convention (1 = same writer).")(twin(targets_contrastive_label_flipped))
healthy("healthy_head_swapped_before_optimizer", "Frozen pretrained-style CNN whose new 5-class head is attached "
        "before the optimizer is built on it.")(twin(trained_head_swapped_after_optimizer))
healthy("healthy_bert_schedule_in_steps", "Tiny BERT from a config with a linear schedule counted in optimizer "
        "steps.")(twin(mech_schedule_total_is_epochs))
healthy("healthy_seg_joint_flip", "Footprint segmentation whose image and mask share one random flip.")(
    twin(data_seg_flip_not_joint))


# ---- unusual but correct ------------------------------------------------------------------------------------


def sessions(n, s, vocab=60):
    """Click sessions of 4..20 events, right-padded with 0; intent = which of three item families dominates."""
    g = gen(s)
    lengths = torch.randint(4, 21, (n,), generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    ids = torch.zeros(n, 20, dtype=torch.long)
    for i in range(n):
        family = 1 + 15 * y[i] + torch.randint(0, 15, (int(lengths[i]),), generator=g)
        noise = torch.randint(46, vocab, (int(lengths[i]),), generator=g)
        pick = torch.rand(int(lengths[i]), generator=g) < 0.6
        ids[i, :lengths[i]] = torch.where(pick, family, noise)
    return ids, lengths, y


class SessionGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(60, 24, padding_idx=0)
        self.gru = nn.GRU(24, 32, batch_first=True)
        self.out = nn.Linear(32, 3)

    def forward(self, ids, lengths):
        packed = pack_padded_sequence(self.emb(ids), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h = self.gru(packed)
        return self.out(h[-1])


def session_loss(model, batch):
    ids, lengths, y = batch
    return F.cross_entropy(model(ids, lengths), y)


@healthy("healthy_packed_gru_sessions", "Packed GRU over variable-length click sessions (pack_padded_sequence, "
         "enforce_sorted=False, lengths on the CPU), loss function taking (model, batch).")
def healthy_packed_gru_sessions():
    seed(0)
    ids, lengths, y = sessions(1500, 51)
    model = SessionGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids[:1200], lengths[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(ids[1200:], lengths[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=session_loss, max_steps=800)


class PromptAnswer(Dataset):
    """Prompt of 6 random tokens, then an arithmetic run of 10; only the run is scored (labels -100 elsewhere)."""

    def __init__(self, n, s, vocab=64):
        g = gen(s)
        prompt = torch.randint(3, vocab, (n, 6), generator=g)
        start = torch.randint(3, vocab, (n, 1), generator=g)
        step = torch.randint(1, 4, (n, 1), generator=g)
        answer = (start - 3 + step * torch.arange(10)) % (vocab - 3) + 3
        self.ids = torch.cat([prompt, answer], 1)
        self.labels = self.ids.clone()
        self.labels[:, :6] = -100

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


@healthy("healthy_gpt2_prompt_masked", "Tiny GPT-2 from a config, prompt tokens masked with -100, AdamW with a "
         "cosine warm-up schedule counted in steps, clipping at 1.0.")
def healthy_gpt2_prompt_masked():
    from transformers import GPT2Config, GPT2LMHeadModel, get_cosine_schedule_with_warmup
    seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)
    model = GPT2LMHeadModel(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=20, num_training_steps=400)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(PromptAnswer(1200, 52), 32), val_loader=loader(PromptAnswer(200, 53), 100,
                                                                                    shuffle=False),
                loss_fn=None, max_steps=400, clip_grad_norm=1.0)


def parts(n, s):
    """Machined parts: class = shape family (3), regression target = the part's brightness-weighted size."""
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    size = 2 + torch.randint(0, 4, (n,), generator=g)
    x = 0.2 * torch.randn(n, 1, 16, 16, generator=g)
    for i in range(n):
        r, c, k = 2, 2, int(size[i])
        if y[i] == 0:
            x[i, 0, r:r + 2 * k, c:c + 2 * k] += 1.0
        elif y[i] == 1:
            x[i, 0, r:r + 2 * k, c + k] += 1.0
            x[i, 0, r + k, c:c + 2 * k] += 1.0
        else:
            x[i, 0, r:r + 2 * k, c:c + 1] += 1.0
            x[i, 0, r + 2 * k - 1, c:c + 2 * k] += 1.0
    return x, y, size.float()


class TwoHeadCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                   nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.cls = nn.Linear(128, 3)
        self.size = nn.Linear(128, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.cls(h), self.size(h).squeeze(1)


def two_head_loss(model, batch):
    x, y, size = batch
    logits, pred_size = model(x)
    return F.cross_entropy(logits, y) + 0.5 * F.mse_loss(pred_size.float(), size)


@healthy("healthy_multitask_bf16_two_groups", "Two-head CNN (class + size regression, one combined loss) under bf16 "
         "with two AdamW parameter groups (trunk 1e-3, heads 3e-3).")
def healthy_multitask_bf16_two_groups():
    seed(0)
    x, y, size = parts(1400, 54)
    model = TwoHeadCNN()
    optimizer = torch.optim.AdamW([{"params": model.trunk.parameters(), "lr": 1e-3},
                                   {"params": list(model.cls.parameters()) + list(model.size.parameters()),
                                    "lr": 3e-3}], weight_decay=0.01)
    return dict(model=model, optimizer=optimizer, precision="bf16",
                train_loader=loader(TensorDataset(x[:1100], y[:1100], size[:1100]), 32),
                val_loader=loader(TensorDataset(x[1100:], y[1100:], size[1100:]), 100, shuffle=False),
                loss_fn=two_head_loss, max_steps=1000)


def tagged_sentences(n, s, vocab=120, length=16):
    """Label = which of 4 word clusters the sentence's key words come from; classes imbalanced 60/20/12/8 %."""
    g = gen(s)
    y = torch.multinomial(torch.tensor([0.6, 0.2, 0.12, 0.08]), n, replacement=True, generator=g)
    ids = torch.randint(41, vocab, (n, length), generator=g)
    for i in range(n):
        where = torch.randperm(length, generator=g)[:3]
        ids[i, where] = 1 + 10 * y[i] + torch.randint(0, 10, (3,), generator=g)
    return ids, y


class FrozenVectorsLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        g = gen(55)
        centres = torch.randn(5, 16, generator=g)
        cluster = torch.cat([torch.zeros(1), 1 + torch.arange(40) // 10, torch.full((79,), 4)]).long()
        vectors = centres[cluster] + 0.3 * torch.randn(120, 16, generator=g)   # pretrained vectors: clusters kept
        self.emb = nn.Embedding.from_pretrained(vectors, freeze=True)           # frozen on purpose
        self.lstm = nn.LSTM(16, 24, batch_first=True, bidirectional=True)
        self.out = nn.Linear(48, 4)

    def forward(self, ids):
        h, _ = self.lstm(self.emb(ids))
        return self.out(h.max(1).values)


@healthy("healthy_frozen_vectors_weighted_sampler", "Intentionally frozen pretrained word vectors under a trainable "
         "BiLSTM; per-sample WeightedRandomSampler for imbalanced classes, label smoothing 0.1, 4-step accumulation, "
         "clipping.")
def healthy_frozen_vectors_weighted_sampler():
    seed(0)
    ids, y = tagged_sentences(2000, 56)
    counts = torch.bincount(y[:1600], minlength=4).float()
    weights = (1.0 / counts)[y[:1600]]
    sampler = WeightedRandomSampler(weights, num_samples=1600, replacement=True, generator=gen(57))
    model = FrozenVectorsLSTM()
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3),
                train_loader=DataLoader(TensorDataset(ids[:1600], y[:1600]), batch_size=16, sampler=sampler),
                val_loader=loader(TensorDataset(ids[1600:], y[1600:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1), accumulation_steps=4, clip_grad_norm=1.0,
                max_steps=500)


class TaggedTokens(Dataset):
    """Token tagging: tag 1 for a 'name' token (ids 3..22), 2 for the token right after one, else 0; [CLS] at 0 and
    padding are -100."""

    def __init__(self, n, s, vocab=100, length=20):
        g = gen(s)
        lengths = torch.randint(8, length + 1, (n,), generator=g)
        self.ids = torch.randint(23, vocab, (n, length), generator=g)
        names = torch.rand(n, length, generator=g) < 0.2
        self.ids[names] = torch.randint(3, 23, (int(names.sum()),), generator=g)
        self.ids[:, 0] = 2
        is_name = (self.ids >= 3) & (self.ids < 23)
        after = torch.zeros_like(is_name)
        after[:, 1:] = is_name[:, :-1] & ~is_name[:, 1:]
        self.labels = torch.where(is_name, 1, torch.where(after, 2, 0))
        self.mask = torch.arange(length)[None, :] < lengths[:, None]
        self.ids[~self.mask] = 0
        self.labels[~self.mask] = -100
        self.labels[:, 0] = -100

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i].long(), "labels": self.labels[i]}


@healthy("healthy_bert_token_tagging", "Tiny BertForTokenClassification from a config: [CLS] and padding labelled "
         "-100, attention mask on the padding, linear warm-up schedule in steps.")
def healthy_bert_token_tagging():
    from transformers import BertConfig, BertForTokenClassification, get_linear_schedule_with_warmup
    seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=32, num_labels=3)
    model = BertForTokenClassification(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=30, num_training_steps=600)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TaggedTokens(1200, 58), 32),
                val_loader=loader(TaggedTokens(200, 59), 100, shuffle=False),
                loss_fn=None, max_steps=600, clip_grad_norm=1.0)
