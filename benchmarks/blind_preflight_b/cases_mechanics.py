"""Set b, accumulation and optimizer mechanics: zero_grad in the wrong place, the loss divided by the
accumulation steps twice, LM labels shifted by hand for a Hugging Face causal LM."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_b.registry import (
    case,
    decay_groups,
    loader,
    seed,
    teacher_classes,
    teacher_regression,
    token_sequences,
)

ZERO_GRAD = (r"zero_grad|(grad\w*|accumulat\w*)[^.]*(cleared|reset|zeroed|discarded|lost|overwritten|only the last)"
             r"|only the last (micro.?batch|batch)")
DOUBLE_DIV = (r"accumulat\w*[^.]*(twice|double|already|again|divid|scal)|(divid|scal)\w*[^.]*accumulat"
              r"|twice|too small by|\b(4|8)x (smaller|too small)|1/(4|8)")
SHIFT = r"shift|offset|next.token|two (positions|tokens)|t ?\+ ?2|position|labels?[^.]*input_ids"


class FraudMLP(nn.Module):
    def __init__(self, d=30):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, x):
        self.zero_grad(set_to_none=True)          # "clear stale gradients before every pass"
        return self.net(x)


@case("fraud_mlp_zero_grad_in_forward", "mechanics",
      "the model's forward() calls self.zero_grad() 'to clear stale gradients', so with accumulation_steps=4 each "
      "micro-batch wipes the gradients of the previous ones and only the last quarter of the batch is learned from",
      ZERO_GRAD)
def fraud_mlp_zero_grad_in_forward():
    seed()
    x, y = teacher_classes(2048, 30, 2, 4)
    model = FraudMLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=nn.CrossEntropyLoss(), accumulation_steps=4)


class SpeechCommandGRU(nn.Module):
    def __init__(self, mels=20, dim=48, classes=8):
        super().__init__()
        self.gru = nn.GRU(mels, dim, num_layers=2, batch_first=True, dropout=0.1)
        self.out = nn.Linear(dim, classes)

    def forward(self, x):
        h, _ = self.gru(x)
        return self.out(h[:, -1])


def _commands(n, s, mels=20, frames=25, classes=8):
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, classes, (n,), generator=g)
    sig = torch.randn(classes, 1, mels, generator=torch.Generator().manual_seed(2))
    return sig[y] + 0.8 * torch.randn(n, frames, mels, generator=g), y


def free_grads_hook(module, args):
    """Registered to 'free gradient memory before each forward' (copied from a memory-saving snippet)."""
    for p in module.parameters():
        p.grad = None


@case("speech_gru_pre_hook_clears_grads", "mechanics",
      "a forward pre-hook sets every p.grad = None before each forward to 'save memory', so gradient accumulation "
      "over 4 micro-batches keeps only the last micro-batch's gradient", ZERO_GRAD)
def speech_gru_pre_hook_clears_grads():
    seed()
    x, y = _commands(1024, 0)
    model = SpeechCommandGRU()
    model.register_forward_pre_hook(free_grads_hook)
    optimizer = torch.optim.AdamW(decay_groups(model), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 16),
                loss_fn=nn.CrossEntropyLoss(), accumulation_steps=4)


GRAD_ACCUM = 8


def scaled_mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x).squeeze(-1), y) / GRAD_ACCUM      # habit from a hand-written accumulation loop


@case("regressor_loss_divided_by_accum_twice", "mechanics",
      "the loss function already divides by GRAD_ACCUM=8 (habit from a hand-written loop) while accumulation_steps=8 "
      "is passed, so the toolkit's averaging applies on top: gradients are 8x too small", DOUBLE_DIV)
def regressor_loss_divided_by_accum_twice():
    seed()
    x, y = teacher_regression(2048, 10, 5)
    model = nn.Sequential(nn.Linear(10, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=scaled_mse, accumulation_steps=GRAD_ACCUM)


class NliPairs(Dataset):
    def __init__(self, n, s, vocab=100, length=20):
        g = torch.Generator().manual_seed(s)
        self.y = torch.randint(0, 3, (n,), generator=g)
        self.ids = torch.randint(5, vocab, (n, length), generator=g)
        self.ids[:, 0] = 2
        self.ids[:, 1] = 5 + self.y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "token_type_ids": (torch.arange(20) >= 10).long(),
                "attention_mask": torch.ones(20, dtype=torch.long), "labels": self.y[i]}


@case("bert_nli_hf_loss_divided_by_accum_twice", "mechanics",
      "compute_loss returns model(**batch).loss / gradient_accumulation_steps (as in a hand-written HF loop) while "
      "accumulation_steps=4 is also passed: the loss is divided by the accumulation steps twice", DOUBLE_DIV)
def bert_nli_hf_loss_divided_by_accum_twice():
    from transformers import BertConfig, BertForSequenceClassification
    seed()
    gradient_accumulation_steps = 4
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=3)
    model = BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(decay_groups(model), lr=5e-4)

    def compute_loss(model, batch):
        return model(**batch).loss / gradient_accumulation_steps

    return dict(model=model, optimizer=optimizer, train_loader=loader(NliPairs(512, 0), 8),
                loss_fn=compute_loss, accumulation_steps=gradient_accumulation_steps)


class ShiftedLM(Dataset):
    """input_ids = seq[:-1], labels = seq[1:]: the shift done by hand."""

    def __init__(self, n, length, vocab, s=0):
        self.seq = token_sequences(n, length + 1, vocab, s)

    def __len__(self):
        return len(self.seq)

    def __getitem__(self, i):
        return {"input_ids": self.seq[i, :-1], "labels": self.seq[i, 1:]}


@case("llama_labels_preshifted_by_hand", "mechanics",
      "the dataset returns input_ids = seq[:-1] and labels = seq[1:], but LlamaForCausalLM shifts the labels again "
      "inside its loss: the model is trained to predict the token two positions ahead", SHIFT)
def llama_labels_preshifted_by_hand():
    from transformers import LlamaConfig, LlamaForCausalLM
    seed()
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(decay_groups(model), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(ShiftedLM(256, 32, 64), 16), loss_fn=None)


class RolledLM(Dataset):
    def __init__(self, n, length, vocab, s=0):
        self.ids = token_sequences(n, length, vocab, s)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        labels = torch.roll(ids, -1)           # next-token targets
        labels[-1] = -100
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


@case("neox_labels_rolled_by_hand", "mechanics",
      "labels are torch.roll(input_ids, -1) ('next-token targets') for GPTNeoXForCausalLM, which shifts labels itself: "
      "the effective target is the token two steps ahead", SHIFT)
def neox_labels_rolled_by_hand():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    seed()
    config = GPTNeoXConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                           rotary_pct=0.5)
    model = GPTNeoXForCausalLM(config)
    optimizer = torch.optim.AdamW(decay_groups(model), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(RolledLM(256, 32, 64, s=3), 16), loss_fn=None)
