"""Set m, family what_is_trained: the parameters the user means to train are not the ones that move."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_m.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_of,
    seed,
    teacher_regression,
)

# --------------------------------------------------------------------------------------------------------------
# 1. Transfer learning on a frozen "pretrained" CNN: the optimizer is built on model.fc, then model.fc is replaced
#    by the new 5-class head. Source: https://github.com/pytorch/pytorch/issues/54765


def backbone():
    torch.manual_seed(21)                    # stands in for the pretrained checkpoint (no downloads)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten())


class PretrainedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = backbone()
        self.fc = nn.Linear(128, 10)          # the checkpoint's own head

    def forward(self, x):
        return self.fc(self.features(x))


def product_photos(n, s):
    g = gen(s)
    base = torch.randn(n, 3, 4, 4, generator=g)
    x = torch.nn.functional.interpolate(base, size=16, mode="bilinear", align_corners=False)
    x = x + 0.2 * torch.randn(n, 3, 16, 16, generator=g)
    with torch.no_grad():
        f = backbone()(x)
    f = (f - f.mean(0)) / (f.std(0) + 1e-6)
    y = (f @ torch.randn(128, 5, generator=gen(400))).argmax(1)
    return x, y


@case("trained_head_swapped_after_optimizer", "what_is_trained",
      "The optimizer is built on model.fc.parameters() before model.fc is replaced by the new 5-class head, so it "
      "still holds the old head's tensors and the new head (the only unfrozen layer) is never updated.",
      r"(optimi[sz]er|Adam).{0,80}(before|prior to).{0,40}(replac|swap|reassign|new (head|layer|fc))|(new|replaced|"
      r"current) (head|fc|classifier|layer)\W{0,3}.{0,60}not (in|among|part of|registered with|known to) the optimi[sz]er"
      r"|optimi[sz]er.{0,60}(old|stale|previous|original|former) (head|fc|parameters|tensors)|(re-?create|rebuild|re-?"
      r"initiali[sz]e|construct) the optimi[sz]er after|\bfc\b.{0,60}not (in|among|part of|held by|registered|known)"
      r"|optimi[sz]er (does not|doesn't) (hold|contain|include|update) .{0,30}(\bfc\b|new head)")
def trained_head_swapped_after_optimizer(fixed=False):
    seed(0)
    x, y = product_photos(1400, 22)
    model = PretrainedNet()
    for p in model.parameters():
        p.requires_grad = False
    if fixed:
        model.fc = nn.Linear(128, 5)
        optimizer = torch.optim.Adam(model.fc.parameters(), lr=1e-2)
    else:
        optimizer = torch.optim.Adam(model.fc.parameters(), lr=1e-2)
        model.fc = nn.Linear(128, 5)          # new head for our 5 product classes
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x[:1100], y[:1100]), 32),
                val_loader=loader(TensorDataset(x[1100:], y[1100:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


fix("trained_head_swapped_after_optimizer", fixed_of(trained_head_swapped_after_optimizer),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# 2. Matrix-factorisation recommender whose item table starts from item2vec vectors via
#    nn.Embedding.from_pretrained, which freezes it by default. Source: https://github.com/RUCAIBox/RecBole/issues/2046


def ratings(n, s, users=300, items=200, d=8):
    g = gen(s)
    gu, gi = gen(500), gen(501)
    uf, itf = torch.randn(users, d, generator=gu) / d ** 0.25, torch.randn(items, d, generator=gi) / d ** 0.25
    u = torch.randint(0, users, (n,), generator=g)
    i = torch.randint(0, items, (n,), generator=g)
    r = (uf[u] * itf[i]).sum(1) + 0.1 * torch.randn(n, generator=g)
    return u, i, r


class MF(nn.Module):
    def __init__(self, item_vectors, freeze):
        super().__init__()
        self.user = nn.Embedding(300, 8)
        self.item = nn.Embedding.from_pretrained(item_vectors) if freeze else \
            nn.Embedding.from_pretrained(item_vectors, freeze=False)
        self.user_bias, self.item_bias = nn.Embedding(300, 1), nn.Embedding(200, 1)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.zeros_(self.user_bias.weight)
        nn.init.zeros_(self.item_bias.weight)

    def forward(self, pairs):
        u, i = pairs[:, 0], pairs[:, 1]
        return (self.user(u) * self.item(i)).sum(1) + self.user_bias(u).squeeze(1) + self.item_bias(i).squeeze(1)


@case("trained_from_pretrained_frozen", "what_is_trained",
      "The item table is built with nn.Embedding.from_pretrained(item2vec), whose default freeze=True keeps the item "
      "vectors fixed, so only the user side of the factorisation learns.",
      r"freeze\s*=\s*(True|False)|from_pretrained.{0,80}(freez|frozen|requires_grad|not (trained|updated))|(item|"
      r"embedding)\w* (table|vectors|weights|embeddings?).{0,40}(frozen|never (updated|change)|not (updated|trained))")
def trained_from_pretrained_frozen(fixed=False):
    seed(0)
    u, i, r = ratings(12000, 23)
    item2vec = 0.1 * torch.randn(200, 8, generator=gen(502))          # vectors from an unrelated text model
    model = MF(item2vec, freeze=not fixed)
    pairs = torch.stack([u, i], 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-2),
                train_loader=loader(TensorDataset(pairs[:10000], r[:10000]), 128),
                val_loader=loader(TensorDataset(pairs[10000:], r[10000:]), 500, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=2000)


fix("trained_from_pretrained_frozen", fixed_of(trained_from_pretrained_frozen), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False)


# --------------------------------------------------------------------------------------------------------------
# 3. CNN-LSTM clip classifier copied from a repo that ran its pretrained ResNet under torch.no_grad(); here the
#    CNN is trained from scratch. Source: https://github.com/pranoyr/cnn-lstm/issues/6


def texture_clips(n, s, frames=4, size=12):
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    yy, xx = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    patterns = torch.stack([torch.sin(xx * 1.6), torch.sin(yy * 1.6), torch.sin((xx + yy) * 1.1)])
    clips = torch.randn(n, frames, 3, size, size, generator=g) * 0.3
    contrast = 0.5 + 1.5 * torch.rand(n, 1, 2, 1, 1, generator=g)
    clips[:, :, [0, 2]] *= contrast * 3
    clips[:, :, 1] += 0.5 * patterns[y][:, None]
    return clips, y


class ClipNet(nn.Module):
    def __init__(self, train_cnn):
        super().__init__()
        self.cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.lstm = nn.LSTM(8, 32, batch_first=True)
        self.fc = nn.Linear(32, 3)
        self.train_cnn = train_cnn

    def forward(self, clips):
        b, t = clips.shape[:2]
        frames = clips.flatten(0, 1)
        if self.train_cnn:
            feats = self.cnn(frames)
        else:
            with torch.no_grad():             # from the repo: "the ResNet is a fixed feature extractor"
                feats = self.cnn(frames)
        out, _ = self.lstm(feats.view(b, t, -1))
        return self.fc(out[:, -1])


@case("trained_cnn_under_no_grad", "what_is_trained",
      "The frame CNN of the CNN-LSTM runs inside torch.no_grad() in forward(), so it gets no gradient and keeps its "
      "random initialisation while only the LSTM and the classifier learn.",
      r"no_grad|inference_mode|(cnn|conv\w*|encoder|backbone|feature extractor)\W{0,3}.{0,60}(no|zero|none|without)"
      r" grad|(cnn|conv\w*|encoder|backbone|feature extractor)\W{0,3}.{0,60}(never|not) (updated|trained|learn)"
      r"|(cut|detached|outside|break\w*) (from |of )?the (autograd )?graph")
def trained_cnn_under_no_grad(fixed=False):
    seed(0)
    x, y = texture_clips(1400, 24)
    model = ClipNet(train_cnn=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1100], y[:1100]), 32),
                val_loader=loader(TensorDataset(x[1100:], y[1100:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1200)


fix("trained_cnn_under_no_grad", fixed_of(trained_cnn_under_no_grad), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# 4. Tiny ViT (Hugging Face, built from a config) fine-tuned head-only with the timm naming "head"; the HF head is
#    called "classifier". Source: https://github.com/huggingface/transformers/issues/400


def tiny_vit():
    from transformers import ViTConfig, ViTForImageClassification
    torch.manual_seed(31)                   # stands in for the pretrained checkpoint
    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=64, num_labels=4, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
    return ViTForImageClassification(cfg)


class DictImages(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "labels": self.y[i]}


def vit_images(n, s):
    g = gen(s)
    x = torch.nn.functional.interpolate(torch.randn(n, 3, 4, 4, generator=g), size=16, mode="bilinear",
                                        align_corners=False) + 0.1 * torch.randn(n, 3, 16, 16, generator=g)
    with torch.no_grad():
        f = tiny_vit().vit(pixel_values=x).last_hidden_state[:, 0]
    f = (f - f.mean(0)) / (f.std(0) + 1e-6)
    return x, (f @ torch.randn(32, 4, generator=gen(600))).argmax(1)


@case("trained_vit_freeze_by_name", "what_is_trained",
      "The freeze loop keeps trainable only names containing timm's 'head' or 'norm', but the Hugging Face ViT head "
      "is named 'classifier', so the new head stays frozen at its random init and only the LayerNorms train.",
      r"classifier.{0,60}(frozen|requires_grad|name|not (trainable|match|updated)|named|never)|head.{0,40}(frozen|"
      r"requires_grad\W{0,3}False|not (trainable|updated))|name[- ]?(match|filter|check|pattern)\w*.{0,40}(head|"
      r"classifier)|'head'|timm")
def trained_vit_freeze_by_name(fixed=False):
    seed(0)
    x, y = vit_images(1200, 25)
    model = tiny_vit()
    keep = ("classifier", "layernorm") if fixed else ("head", "norm")      # timm: head, fc_norm, norm
    for name, p in model.named_parameters():
        p.requires_grad = any(k in name for k in keep)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0),
                train_loader=loader(DictImages(x[:900], y[:900]), 32),
                val_loader=loader(DictImages(x[900:], y[900:]), 100, shuffle=False),
                loss_fn=None, max_steps=800)


fix("trained_vit_freeze_by_name", fixed_of(trained_vit_freeze_by_name),
    acc_of(lambda m, b: (m(pixel_values=b["pixel_values"]).logits.argmax(-1), b["labels"])), "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# 5. House-price MLP initialised with zeros "like linear regression".
#    Source: https://community.deeplearning.ai/t/week-1-programming-assignment-initialization-exercise-1-initialize-parameters-zeros/121049


def init_zeros(m):
    if isinstance(m, nn.Linear):
        nn.init.zeros_(m.weight)
        nn.init.zeros_(m.bias)


@case("trained_zero_init", "what_is_trained",
      "Every Linear weight of the house-price MLP is initialised to zero, so the ReLU hidden units output zero, "
      "the hidden weights get zero gradients and only the output bias learns (the model predicts the mean).",
      r"(zero|constant)[- ]?(initiali[sz]|init\b)|init\w*.{0,20}(to |with |as )?(zero|0\b|constant)|zeros_|"
      r"symmetr\w*|(weights?|parameters?) (are |is )?(all )?zero")
def trained_zero_init(fixed=False):
    seed(0)
    x, y = teacher_regression(2000, 12, s=26)
    y = y.unsqueeze(1) * 3 + 5
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    if not fixed:
        model.apply(init_zeros)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1500)


fix("trained_zero_init", fixed_of(trained_zero_init), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)
