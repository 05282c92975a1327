"""Set b, what is trained: unregistered tensors, parameters outside the optimizer, dropout as keep-probability,
broken HF tying, a model left in eval()."""

from __future__ import annotations

import tempfile

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_b.registry import case, decay_groups, loader, seed, teacher_classes, token_sequences

UNREGISTERED = (r"nn\.Parameter|ParameterDict|ModuleList|ModuleDict|register_(parameter|buffer|module)"
                r"|not (a |an )?(registered|module parameter|parameter|submodule)|plain (tensor|attribute|list|dict)"
                r"|python (list|dict)|tensor attribute|unregistered|outside (the )?(model|module)'?s? parameters"
                r"|not (in|among|part of) (the )?(model|module)'?s? parameters|(not|never|missing)[^.]*optimi[sz]er")
NOT_IN_OPT = (r"(not|never|missing|absent)[^.]*optimi[sz]er|optimi[sz]er[^.]*(miss|lack|omit|not (updat|includ|contain|hold)"
              r"|does(n't| not) (updat|includ|contain|hold))|param(eter)? groups?[^.]*(miss|not)")
DROPOUT = r"dropout|keep.?prob|pdrop|drop(ping)? (probability|rate)"
TIED = r"\btie|\btied|tying|untie|shared (weight|embedding)|same (weight|tensor|parameter|storage) as the (input )?embedding"
EVAL = r"\beval|train\(\)|training mode|inference mode|\.training"


class MultiTaskTabular(nn.Module):
    """A shared trunk and one head per task, the heads kept in a Python list."""

    def __init__(self, d=20, tasks=3, classes=4):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.heads = [nn.Linear(64, classes) for _ in range(tasks)]

    def forward(self, x):
        h = self.trunk(x)
        return torch.stack([head(h) for head in self.heads], 1)      # (B, tasks, classes)


def multitask_loss(model, batch):
    x, y = batch                                                     # y: (B, tasks)
    logits = model(x)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


@case("multitask_heads_in_python_list", "what_is_trained",
      "the task heads are kept in a plain Python list instead of nn.ModuleList: they are not registered, so "
      "model.parameters() (and the optimizer) miss them and the heads stay at their random init while they get gradients",
      UNREGISTERED)
def multitask_heads_in_python_list():
    seed()
    x, y0 = teacher_classes(1024, 20, 4, 0)
    _, y1 = teacher_classes(1024, 20, 4, 1)
    y = torch.stack([y0, y1, (y0 + y1) % 4], 1)
    model = MultiTaskTabular()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64), loss_fn=multitask_loss)


class ProtoNet(nn.Module):
    """Embedding + one learnable prototype per class, the prototypes kept in a dict of nn.Parameters."""

    def __init__(self, d=16, classes=5, dim=32):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(d, dim), nn.ReLU(), nn.Linear(dim, dim))
        self.prototypes = {c: nn.Parameter(torch.randn(dim)) for c in range(classes)}

    def forward(self, x):
        z = self.embed(x)
        protos = torch.stack([self.prototypes[c] for c in sorted(self.prototypes)])
        return -torch.cdist(z, protos) ** 2


@case("protonet_prototypes_in_plain_dict", "what_is_trained",
      "the class prototypes are nn.Parameters stored in a plain dict (not nn.ParameterDict): they are not registered "
      "with the module, so they get gradients but the optimizer built from model.parameters() never updates them",
      UNREGISTERED)
def protonet_prototypes_in_plain_dict():
    seed()
    x, y = teacher_classes(1024, 16, 5, 3)
    model = ProtoNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.CrossEntropyLoss())


class TinyTextEncoder(nn.Module):
    def __init__(self, vocab=300, dim=32, classes=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.block = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.1, batch_first=True, norm_first=True)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        return self.head(self.norm(self.block(self.emb(tokens))).mean(1))


def _keyword_texts(n, s, vocab=300, classes=4, length=16):
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, classes, (n,), generator=g)
    tokens = torch.randint(10, vocab, (n, length), generator=g)
    tokens[:, 0] = y + 1
    return tokens, y


@case("decay_groups_by_name_miss_layernorm", "what_is_trained",
      "the weight-decay parameter groups are filtered by name ('weight' with ndim > 1 -> decay, 'bias' -> no decay), "
      "so the LayerNorm weights (1-D, named 'weight') land in neither group: they get gradients but are never updated",
      NOT_IN_OPT)
def decay_groups_by_name_miss_layernorm():
    seed()
    tokens, y = _keyword_texts(1024, 0)
    model = TinyTextEncoder()
    decay = [p for n, p in model.named_parameters() if "weight" in n and p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if "bias" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(tokens, y), 32),
                loss_fn=nn.CrossEntropyLoss())


class Encoder(nn.Module):
    def __init__(self, d=24, dim=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, dim))

    def forward(self, x):
        return self.net(x)


@case("simclr_projection_head_outside_model", "what_is_trained",
      "the projection head is a separate nn.Module used inside the loss function, but the optimizer is built from "
      "the encoder's parameters only: the head gets gradients and stays at its random init", NOT_IN_OPT + "|" + UNREGISTERED)
def simclr_projection_head_outside_model():
    seed()
    x, _ = teacher_classes(1024, 24, 4, 0)
    model = Encoder()
    projection = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 16))

    def nt_xent(model, batch, tau=0.2):
        (xb,) = batch
        v1 = xb + 0.1 * torch.randn_like(xb)
        v2 = xb * (torch.rand_like(xb) > 0.1)
        z = F.normalize(projection(model(torch.cat([v1, v2]))), dim=1)
        sim = z @ z.t() / tau
        sim.fill_diagonal_(-1e9)
        n = xb.size(0)
        target = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
        return F.cross_entropy(sim, target)

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x), 64), loss_fn=nt_xent)


class PetCNN(nn.Module):
    def __init__(self, classes=6):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Dropout2d(0.8), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Dropout2d(0.8),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(32, classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def _pets(n, s, classes=6):
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, classes, (n,), generator=g)
    colours = torch.rand(classes, 3, 1, 1, generator=torch.Generator().manual_seed(5))
    return colours[y] + 0.2 * torch.randn(n, 3, 16, 16, generator=g), y


@case("pet_cnn_dropout2d_keep_080", "what_is_trained",
      "nn.Dropout2d(0.8) was meant to keep 80% of the feature maps, but p is the drop probability: 80% of the "
      "channels are zeroed in each block", DROPOUT)
def pet_cnn_dropout2d_keep_080():
    seed()
    x, y = _pets(768, 0)
    model = PetCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=nn.CrossEntropyLoss())


class LMStream(Dataset):
    def __init__(self, n, length, vocab, s=0):
        self.ids = token_sequences(n, length, vocab, s)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@case("gpt2_pdrop_as_keep_prob", "what_is_trained",
      "GPT2Config(resid_pdrop=0.9, embd_pdrop=0.9, attn_pdrop=0.9) was written as keep probabilities: GPT-2 drops 90% "
      "of its embeddings, residual outputs and attention weights in training", DROPOUT)
def gpt2_pdrop_as_keep_prob():
    from transformers import GPT2Config, GPT2LMHeadModel
    seed()
    config = GPT2Config(vocab_size=64, n_positions=48, n_embd=32, n_layer=2, n_head=2, bos_token_id=1, eos_token_id=2,
                        resid_pdrop=0.9, embd_pdrop=0.9, attn_pdrop=0.9)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(decay_groups(model), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(LMStream(256, 32, 64), 16), loss_fn=None)


@case("gpt2_head_initialised_from_embedding_clone", "what_is_trained",
      "lm_head.weight is replaced by nn.Parameter(wte.weight.clone()) 'to start the head from the embeddings', which "
      "unties it from the input embedding although tie_word_embeddings=True: two separate matrices are trained", TIED)
def gpt2_head_initialised_from_embedding_clone():
    from transformers import GPT2Config, GPT2LMHeadModel
    seed()
    config = GPT2Config(vocab_size=64, n_positions=48, n_embd=32, n_layer=2, n_head=2, bos_token_id=1, eos_token_id=2,
                        tie_word_embeddings=True)
    model = GPT2LMHeadModel(config)
    model.lm_head.weight = nn.Parameter(model.transformer.wte.weight.detach().clone())
    optimizer = torch.optim.AdamW(decay_groups(model), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(LMStream(256, 32, 64, s=1), 16), loss_fn=None)


@case("llama_input_embeddings_reinitialised_untied", "what_is_trained",
      "a Llama-style model with tie_word_embeddings=True gets a freshly initialised nn.Embedding via "
      "set_input_embeddings() (custom init) and is never re-tied: lm_head keeps the old matrix, input and output "
      "embeddings are now separate", TIED)
def llama_input_embeddings_reinitialised_untied():
    from transformers import LlamaConfig, LlamaForCausalLM
    seed()
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config)
    new_emb = nn.Embedding(64, 32, padding_idx=0)
    nn.init.normal_(new_emb.weight, std=0.02)
    model.set_input_embeddings(new_emb)
    optimizer = torch.optim.AdamW(decay_groups(model), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(LMStream(256, 32, 64, s=2), 16), loss_fn=None)


class ReviewSet(Dataset):
    def __init__(self, n, s, vocab=120, length=20):
        g = torch.Generator().manual_seed(s)
        self.y = torch.randint(0, 2, (n,), generator=g)
        self.ids = torch.randint(5, vocab, (n, length), generator=g)
        self.ids[:, 1] = 3 + self.y
        self.ids[:, 0] = 1

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.y[i]}


@case("distilbert_reloaded_from_checkpoint_stays_eval", "what_is_trained",
      "the model is reloaded with from_pretrained() from the local warm-up checkpoint, which returns it in eval() mode, "
      "and the fine-tuning loop never calls model.train(): dropout is off for the whole run", EVAL)
def distilbert_reloaded_from_checkpoint_stays_eval():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    seed()
    config = DistilBertConfig(vocab_size=120, dim=32, hidden_dim=64, n_layers=2, n_heads=2, max_position_embeddings=64,
                              num_labels=2, dropout=0.1, attention_dropout=0.1, pad_token_id=0)
    warm = DistilBertForSequenceClassification(config)
    with tempfile.TemporaryDirectory() as ckpt:
        warm.save_pretrained(ckpt)
        model = DistilBertForSequenceClassification.from_pretrained(ckpt)
    optimizer = torch.optim.AdamW(decay_groups(model), lr=5e-4)
    return dict(model=model, optimizer=optimizer, train_loader=loader(ReviewSet(512, 0), 16), loss_fn=None)


class PatchViT(nn.Module):
    def __init__(self, classes=6, dim=48, patch=4, size=16):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, 4, 96, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Dropout(0.1), nn.Linear(dim, classes))

    def forward(self, x):
        p = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(x.size(0), -1, -1), p], 1) + self.pos
        return self.head(self.encoder(h)[:, 0])


def count_flops_and_print_summary(model, example):
    """Profiling helper run once before training (sets inference mode for a clean trace)."""
    model.eval()
    with torch.no_grad():
        out = model(example)
    return sum(p.numel() for p in model.parameters()), tuple(out.shape)


@case("vit_left_in_eval_by_profiling_helper", "what_is_trained",
      "a FLOPs/summary helper called before training puts the ViT in eval() and nothing switches it back: dropout is "
      "off for the whole run", EVAL)
def vit_left_in_eval_by_profiling_helper():
    seed()
    x, y = _pets(640, 1)
    model = PatchViT()
    count_flops_and_print_summary(model, x[:2])
    optimizer = torch.optim.AdamW(decay_groups(model, 0.05), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=nn.CrossEntropyLoss())
