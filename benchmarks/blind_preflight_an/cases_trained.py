"""Set an, family what_is_trained: parts of the model the optimizer never moves, without a crash."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_an.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    seed,
    teacher_classes,
    token_sequences,
)


def _dev(m):
    return next(m.parameters()).device


def _cls_fwd(m, b):
    return m(b[0].to(_dev(m))).argmax(-1).cpu(), b[1]


# ----------------------------------------------------------------------------------------------------------------
# GPT-2: the token embeddings frozen to 'keep them', not knowing lm_head is the same (tied) tensor.

class LMSet(Dataset):
    def __init__(self, ids):
        self.ids = ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build_gpt2_tied_frozen_wte(fixed: bool = False) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    seed(0)
    old_vocab, new_vocab = 40, 56  # 16 added domain tokens
    ids = token_sequences(1500, 24, new_vocab, s=21)
    cfg = GPT2Config(vocab_size=old_vocab, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)
    model = GPT2LMHeadModel(cfg)
    model.resize_token_embeddings(new_vocab)  # the 16 added domain tokens
    if not fixed:
        model.transformer.wte.weight.requires_grad_(False)  # "keep the pretrained token embeddings as they are"
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(LMSet(ids[:1200]), 32),
                val_loader=loader(LMSet(ids[1200:]), 100, shuffle=False), max_steps=1000)


def next_token_acc(model, kw):
    def fn(m, b):
        ids = b["input_ids"].to(_dev(m))
        pred = m(input_ids=ids).logits[:, :-1].argmax(-1)
        return (pred == ids[:, 1:]).sum().item(), ids[:, 1:].numel()
    return mean_over(model, kw["val_loader"], fn)


case("an_trained_gpt2_tied_frozen_wte", "what_is_trained",
     "After adding 16 tokens, the GPT-2 token embedding wte.weight is frozen with requires_grad_(False) to 'keep "
     "the pretrained embeddings', but lm_head.weight is tied to it (the same tensor), so the output layer is frozen "
     "too and the new tokens' rows stay at their random initialisation.",
     r"tie_word_embeddings|\btied\b|weight[- ]tying|(shares?|same) (the )?(weight|tensor|parameter).{0,60}(lm_head|output|embedding)|"
     r"lm_head.{0,80}(frozen|requires_grad|not (trained|updated)|never (trained|updated))|"
     r"(output|unembedding) (layer|projection|matrix).{0,60}(frozen|not (trained|updated))|"
     r"(embedding|wte).{0,80}(frozen|requires_grad.{0,10}False).{0,80}(output|lm_head|head)")(
    build_gpt2_tied_frozen_wte)
fix("an_trained_gpt2_tied_frozen_wte", fixed_of(build_gpt2_tied_frozen_wte), next_token_acc,
    "val next-token accuracy")


# ----------------------------------------------------------------------------------------------------------------
# A learnable positional embedding registered as a buffer: it moves with .to() and is saved, but is never trained.

def order_task(n: int, s: int, length: int = 12, vocab: int = 16):
    """Label 1 when token 3 comes before token 4 in the sequence, else 0 (both always present once)."""
    g = gen(s)
    x = torch.randint(5, vocab, (n, length), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    for i in range(n):
        a, b = torch.randperm(length, generator=g)[:2].sort().values.tolist()
        first, second = (3, 4) if y[i] == 1 else (4, 3)
        x[i, a], x[i, b] = first, second
    return x, y


class OrderNet(nn.Module):
    def __init__(self, fixed: bool, vocab: int = 16, length: int = 12, d: int = 32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        if fixed:
            self.pos = nn.Parameter(0.02 * torch.randn(1, length, d))
        else:
            self.register_buffer("pos", torch.zeros(1, length, d))  # "so it follows model.to(device)"
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(d, 2)

    def forward(self, x):
        h = self.enc(self.emb(x) + self.pos)
        return self.head(h.mean(1))


def build_pos_buffer(fixed: bool = False) -> dict:
    seed(0)
    x, y = order_task(2000, 22)
    model = OrderNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


case("an_trained_pos_buffer", "what_is_trained",
     "The learnable positional embedding is created with register_buffer('pos', torch.zeros(...)) instead of as an "
     "nn.Parameter, so it is not in model.parameters(), stays at zero, and the transformer cannot tell token order.",
     r"register_buffer|buffer.{0,60}(not (a )?param|not trained|never (trained|updated|learn))|nn\.Parameter|"
     r"(positional|position) (embedding|encoding)s?.{0,60}(zero|constant|not (trained|learn)|never|frozen)|"
     r"(order|position)[- ](blind|invariant|agnostic)|permutation[- ]invariant")(build_pos_buffer)
fix("an_trained_pos_buffer", fixed_of(build_pos_buffer), acc_of(_cls_fwd), "val accuracy")


# ----------------------------------------------------------------------------------------------------------------
# Layer-wise LR param groups built by name ("blocks.", "head."): the patch embedding is left out of every group.

class PatchMLP(nn.Module):
    def __init__(self, d_in: int = 64, d: int = 12, classes: int = 4):
        super().__init__()
        self.patch_embed = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(),
                                                   nn.Linear(4 * d, d)) for _ in range(3)])
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        h = self.patch_embed(x)
        for blk in self.blocks:
            h = h + blk(h)
        return self.head(h)


def build_param_groups_miss(fixed: bool = False) -> dict:
    seed(0)
    x, y = teacher_classes(2400, 64, 4, s=23)
    model = PatchMLP()
    base, decay = 2e-3, 0.75
    groups = []
    for i, blk in enumerate(model.blocks):
        groups.append({"params": list(blk.parameters()), "lr": base * decay ** (len(model.blocks) - i)})
    groups.append({"params": list(model.head.parameters()), "lr": base})
    if fixed:
        groups.append({"params": list(model.patch_embed.parameters()), "lr": base * decay ** (len(model.blocks) + 1)})
    return dict(model=model, optimizer=torch.optim.AdamW(groups, lr=base),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


case("an_trained_param_groups_miss", "what_is_trained",
     "The layer-wise learning-rate parameter groups are built from model.blocks and model.head only; "
     "model.patch_embed is in no param group, so the optimizer never updates the input projection.",
     r"patch_embed|(not|never) (in|part of|covered by) any (param(eter)? )?group|"
     r"(no|not in any|outside (every|all|any)) (param(eter)? )?groups?\b|"
     r"(missing|absent|left out|omitted) from (every|all|the) (param(eter)? )?groups?|"
     r"(param(eter)? )?groups?.{0,60}(miss|omit|leave out|left out|skip)|input projection.{0,60}(never|not) (updated|trained)")(
    build_param_groups_miss)
fix("an_trained_param_groups_miss", fixed_of(build_param_groups_miss), acc_of(_cls_fwd), "val accuracy")


# ----------------------------------------------------------------------------------------------------------------
# Feature-extraction idiom left in: the backbone forward runs under torch.no_grad() though it is meant to be trained.

class NoGradTagger(nn.Module):
    def __init__(self, fixed: bool, vocab: int = 16, d: int = 32):
        super().__init__()
        from transformers import BertConfig, BertModel

        self.fixed = fixed
        cfg = BertConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
        self.backbone = BertModel(cfg, add_pooling_layer=False)
        self.head = nn.Linear(d, 2)

    def forward(self, ids):
        if self.fixed:
            h = self.backbone(input_ids=ids).last_hidden_state
        else:
            with torch.no_grad():  # from the feature-extraction example
                h = self.backbone(input_ids=ids).last_hidden_state
        return self.head(h[:, 0])


def build_nograd_backbone(fixed: bool = False) -> dict:
    seed(0)
    x, y = order_task(2000, 24)
    x[:, 0] = 1  # [CLS]
    model = NoGradTagger(fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


case("an_trained_nograd_backbone", "what_is_trained",
     "The model's forward runs its (randomly initialised, meant to be fine-tuned) BERT backbone under "
     "torch.no_grad(), copied from a feature-extraction example, so only the linear head on the [CLS] state learns.",
     r"no_grad|(backbone|bert).{0,80}(no gradient|not (trained|updated|receiv)|frozen|never (trained|updated))|"
     r"(no|zero|none) grad(ient)?s?.{0,60}(backbone|bert)|"
     r"(gradients?|grads?) (are |is )?None.{0,60}(param|weight|layer)|detach")(build_nograd_backbone)
fix("an_trained_nograd_backbone", fixed_of(build_nograd_backbone), acc_of(_cls_fwd), "val accuracy")


# ----------------------------------------------------------------------------------------------------------------
# Activation checkpointing (use_reentrant=True) around the encoder on raw inputs: the encoder gets no gradients.

class CkptEmbedder(nn.Module):
    def __init__(self, fixed: bool, d_in: int = 48, emb: int = 6, classes: int = 6):
        super().__init__()
        self.fixed = fixed
        self.encoder = nn.Sequential(nn.Linear(d_in, 128), nn.ReLU(), nn.Linear(128, emb))
        self.head = nn.Sequential(nn.Linear(emb, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, x):
        z = checkpoint(self.encoder, x, use_reentrant=not self.fixed)  # to save activation memory
        return self.head(z)


def build_ckpt_reentrant(fixed: bool = False) -> dict:
    seed(0)
    x, y = teacher_classes(2400, 48, 6, s=25)
    model = CkptEmbedder(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


case("an_trained_ckpt_reentrant", "what_is_trained",
     "The encoder is wrapped in torch.utils.checkpoint.checkpoint(..., use_reentrant=True) and called on the raw "
     "input batch, which does not require grad: the reentrant checkpoint's output then carries no graph to the "
     "encoder, whose parameters get no gradient and stay at their initialisation.",
     r"checkpoint|use_reentrant|reentrant|None of the inputs have requires_grad|"
     r"inputs? (does|do) not require grad")(build_ckpt_reentrant)
fix("an_trained_ckpt_reentrant", fixed_of(build_ckpt_reentrant), acc_of(_cls_fwd), "val accuracy")

