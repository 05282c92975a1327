"""Healthy cases: five corrected twins of broken cases and five unusual but correct setups. None may raise a warning."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_k.cases_data import session_collate_unsorted_labels
from benchmarks.blind_preflight_k.cases_mechanics import fraud_steplr_per_batch
from benchmarks.blind_preflight_k.cases_shapes import price_mlp_target_broadcast
from benchmarks.blind_preflight_k.cases_targets import gpt2_labels_preshifted
from benchmarks.blind_preflight_k.cases_trained import insurance_layers_in_python_list
from benchmarks.blind_preflight_k.registry import gen, healthy, loader, seed, split, teacher_classes, twin

# --- corrected twins -----------------------------------------------------------------------------------------------------
healthy("price_mlp_targets_unsqueezed",
        "House-price MLP with (N, 1) outputs against targets unsqueezed to (N, 1) for nn.MSELoss.",
        )(twin(price_mlp_target_broadcast))
healthy("gpt2_labels_equal_input_ids",
        "Tiny GPT2LMHeadModel from a config, labels = input_ids (the model shifts them itself), loss from model(**batch).",
        )(twin(gpt2_labels_preshifted))
healthy("session_gru_packed_sorted_collate",
        "Packed GRU over variable-length sessions; the collate sorts by length, reorders the labels the same way and "
        "keeps lengths on the CPU.",
        )(twin(session_collate_unsorted_labels))
healthy("insurance_layers_in_modulelist",
        "Tabular MLP whose hidden layers live in an nn.ModuleList.",
        )(twin(insurance_layers_in_python_list))
healthy("fraud_steplr_in_steps",
        "SGD with momentum and a StepLR whose step_size is given in optimizer steps (10 epochs * len(loader)).",
        )(twin(fraud_steplr_per_batch))


# --- unusual but correct ---------------------------------------------------------------------------------------------------
class ReverseDataset(Dataset):
    """Seq2seq: reverse a variable-length token string; inputs padded with 0 and masked, labels padded with -100."""

    def __init__(self, n, s, width=10):
        g = gen(s)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(5, width + 1, (1,), generator=g))
            seq = torch.randint(3, 32, (length,), generator=g)
            ids = torch.zeros(width, dtype=torch.long)
            ids[:length] = seq
            mask = (ids != 0).long()
            labels = torch.full((width,), -100, dtype=torch.long)
            labels[:length] = seq.flip(0)
            self.items.append({"input_ids": ids, "attention_mask": mask, "labels": labels})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


@healthy("t5_tiny_reverse_seq2seq",
         "A tiny T5ForConditionalGeneration built from a config, trained to reverse padded token strings: attention "
         "mask on the inputs, -100 on the padded label positions, loss from model(**batch).")
def t5_tiny_reverse_seq2seq():
    from transformers import T5Config, T5ForConditionalGeneration
    seed(0)
    cfg = T5Config(vocab_size=32, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                   dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(cfg)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(ReverseDataset(800, 401), batch_size=32),
                val_loader=loader(ReverseDataset(160, 402), batch_size=40, shuffle=False),
                loss_fn=None, max_steps=400)


class ClsDataset(Dataset):
    def __init__(self, ids, labels):
        self.ids, self.labels = ids, labels

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


@healthy("bert_tiny_frozen_embeddings_two_lr_groups",
         "A tiny BertForSequenceClassification from a config; word embeddings frozen on purpose (kept out of the "
         "optimizer), the encoder at 5e-4 and the classifier at 3e-3 in two AdamW groups, warm-up with LinearLR.")
def bert_tiny_frozen_embeddings_two_lr_groups():
    from transformers import BertConfig, BertForSequenceClassification
    seed(0)
    cfg = BertConfig(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=16, num_labels=2, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(cfg)
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    g = gen(411)
    ids = torch.randint(2, 32, (1200, 12), generator=g)
    ids[:, 0] = 1                                                 # [CLS]
    labels = ((ids[:, 1:] < 10).sum(1) > (ids[:, 1:] >= 24).sum(1)).long()
    encoder = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("classifier")]
    optimizer = torch.optim.AdamW([{"params": encoder, "lr": 5e-4},
                                   {"params": model.classifier.parameters(), "lr": 3e-3}], weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=30)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(ClsDataset(ids[:1000], labels[:1000]), batch_size=32),
                val_loader=loader(ClsDataset(ids[1000:], labels[1000:]), batch_size=50, shuffle=False),
                loss_fn=None, max_steps=400)


class TwoHeadCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                   nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.cls = nn.Linear(16, 3)
        self.reg = nn.Linear(16, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.cls(h), self.reg(h).squeeze(-1)


@healthy("multitask_cnn_weighted_ce_bf16",
         "Two-head CNN (shape class with inverse-frequency class weights + brightness regression), the loss a weighted "
         "sum of both, trained under bf16 autocast.")
def multitask_cnn_weighted_ce_bf16():
    seed(0)
    g = gen(421)
    n = 1200
    cls = torch.multinomial(torch.tensor([0.6, 0.3, 0.1]), n, replacement=True, generator=g)
    bright = torch.rand(n, generator=g) + 0.5
    img = 0.2 * torch.randn(n, 1, 12, 12, generator=g)
    for i in range(n):
        r, c = torch.randint(0, 6, (2,), generator=g)
        if cls[i] == 0:
            img[i, 0, r, c:c + 6] += bright[i]                    # horizontal bar
        elif cls[i] == 1:
            img[i, 0, r:r + 6, c] += bright[i]                    # vertical bar
        else:
            img[i, 0, r:r + 3, c:c + 3] += bright[i]              # square
    counts = torch.bincount(cls[:1000], minlength=3).float()
    weights = counts.sum() / (3 * counts)
    model = TwoHeadCNN()

    def loss_fn(model, batch):
        x, y_cls, y_bright = batch
        logits, bright_hat = model(x)
        return F.cross_entropy(logits.float(), y_cls, weight=weights.to(x.device)) \
            + 0.5 * F.mse_loss(bright_hat.float(), y_bright)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(img[:1000], cls[:1000], bright[:1000]), batch_size=40),
                val_loader=loader(TensorDataset(img[1000:], cls[1000:], bright[1000:]), batch_size=100,
                                  shuffle=False),
                loss_fn=loss_fn, precision="bf16", max_steps=300)


@healthy("accumulated_label_smoothing_cosine",
         "MLP with 4-step gradient accumulation (micro-batches of 16), CrossEntropyLoss(label_smoothing=0.1), Nesterov "
         "SGD, clip_grad_norm=1.0 and a cosine schedule over max_steps.")
def accumulated_label_smoothing_cosine():
    seed(0)
    x, y = teacher_classes(1600, 16, 5, s=431)
    (xt, yt), (xv, yv) = split(x, y, 1280)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    max_steps = 300
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max_steps),
                train_loader=loader(TensorDataset(xt, yt), batch_size=16),
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1), accumulation_steps=4, clip_grad_norm=1.0,
                max_steps=max_steps)


class DenoisingAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.dec = nn.Sequential(nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1), nn.ReLU(),
                                 nn.ConvTranspose2d(8, 1, 4, stride=2, padding=1))

    def forward(self, x):
        return self.dec(self.enc(x))


@healthy("denoising_autoencoder_unlabelled",
         "Convolutional denoising autoencoder on unlabelled 16x16 blobs: batches are 1-tuples (x,), the noise is drawn "
         "with randn_like inside the loss and the target is the clean input.")
def denoising_autoencoder_unlabelled():
    seed(0)
    g = gen(441)
    n = 800
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    centers = torch.rand(n, 2, generator=g) * 12 + 2
    width = torch.rand(n, generator=g) * 2 + 1.5
    img = torch.exp(-((yy - centers[:, 0, None, None]) ** 2 + (xx - centers[:, 1, None, None]) ** 2)
                    / (2 * width[:, None, None] ** 2)).unsqueeze(1)
    model = DenoisingAE()

    def loss_fn(model, batch):
        (x,) = batch
        noisy = x + 0.2 * torch.randn_like(x)
        return F.mse_loss(model(noisy), x)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(img[:700]), batch_size=32),
                val_loader=loader(TensorDataset(img[700:]), batch_size=50, shuffle=False),
                loss_fn=loss_fn, max_steps=300)
