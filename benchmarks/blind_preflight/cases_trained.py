"""What is trained: unregistered tensors, the optimizer's parameter list, dropout, tied heads, eval mode."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight.registry import case, loader, seed, teacher_classes, token_sequences

NOT_PARAMETER = (r"nn\.Parameter|register_(parameter|buffer)|not (a |an )?(registered|module parameter|parameter)|"
                 r"plain (tensor|attribute)|tensor attribute|unregistered|outside (the )?(model|module)'?s? parameters|"
                 r"not (in|among|part of) (the )?(model|module)'?s? parameters")
NOT_IN_OPTIMIZER = (r"(not|never|missing|absent)[^.]*optimi[sz]er|optimi[sz]er[^.]*(miss|lack|omit|not (updat|includ|contain|hold)|"
                    r"does(n't| not) (updat|includ|contain|hold))")
DROPOUT = r"dropout|keep.?prob"
TIED = r"\btie|\btied|tying|shared (weight|embedding)|same (weight|tensor|parameter) as the (input )?embedding"
EVAL = r"\beval|train\(\)|training mode|inference mode|\.training"


class CalibratedClassifier(nn.Module):
    def __init__(self, d=16, classes=4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, classes))
        self.log_temperature = torch.zeros(1, requires_grad=True)        # meant: nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.body(x) / self.log_temperature.exp()


@case("learnable_temperature_plain_tensor", "what_is_trained",
      "the learnable temperature is a plain tensor with requires_grad=True, not an nn.Parameter: it receives a "
      "gradient but is not in model.parameters(), so the optimizer never updates it", NOT_PARAMETER)
def learnable_temperature_plain_tensor():
    seed()
    x, y = teacher_classes(1024, 16, 4)
    model = CalibratedClassifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.CrossEntropyLoss())


class PosTransformer(nn.Module):
    def __init__(self, vocab=300, dim=32, classes=5, max_len=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        # learned positional embedding, but kept as a plain tensor attribute
        self.pos = (torch.randn(1, max_len, dim) * 0.02).requires_grad_()
        layer = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens) + self.pos[:, : tokens.shape[1]])
        return self.head(h[:, 0])


def _ordered_topic(n, length=20, vocab=300, classes=5, s=0):
    g = torch.Generator().manual_seed(s)
    labels = torch.randint(0, classes, (n,), generator=g)
    tokens = torch.randint(0, vocab, (n, length), generator=g)
    tokens[:, 3] = labels * 11 + 2                      # the label is written at a fixed position
    return tokens, labels


@case("transformer_pos_embedding_plain_tensor", "what_is_trained",
      "the learned positional embedding is a tensor attribute with requires_grad_() instead of an nn.Parameter: "
      "it gets gradients but never reaches the optimizer (and is not saved in the state_dict)", NOT_PARAMETER)
def transformer_pos_embedding_plain_tensor():
    seed()
    tokens, labels = _ordered_topic(512)
    model = PosTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(tokens, labels), 32),
                loss_fn=nn.CrossEntropyLoss())


class GRUClassifier(nn.Module):
    def __init__(self, vocab=300, dim=32, classes=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        _, h = self.encoder(self.embed(tokens))
        return self.head(h[-1])


@case("gru_optimizer_encoder_only", "what_is_trained",
      "the optimizer is built from model.encoder.parameters(), so the embedding and the classification head get "
      "gradients but are never updated", NOT_IN_OPTIMIZER)
def gru_optimizer_encoder_only():
    seed()
    tokens, labels = _ordered_topic(512, s=3)
    model = GRUClassifier()
    optimizer = torch.optim.Adam(model.encoder.parameters(), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(tokens, labels), 32),
                loss_fn=nn.CrossEntropyLoss())


class SmallResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                   nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        h = self.stem(x)
        h = F.relu(h + self.block(h))
        return self.fc(self.pool(h).flatten(1))


def _colour_images(n, classes, s=0, size=16):
    g = torch.Generator().manual_seed(s)
    labels = torch.randint(0, classes, (n,), generator=g)
    palette = torch.rand(classes, 3, 1, 1, generator=torch.Generator().manual_seed(7))
    images = palette[labels] + 0.25 * torch.randn(n, 3, size, size, generator=g)
    return (images - 0.5) / 0.3, labels


@case("finetune_head_replaced_after_optimizer", "what_is_trained",
      "the optimizer is created before model.fc is replaced for the new 5-class task, so it holds the old head's "
      "tensors and the new head is never updated", NOT_IN_OPTIMIZER)
def finetune_head_replaced_after_optimizer():
    seed()
    images, labels = _colour_images(512, 5)
    model = SmallResNet(classes=10)                    # "pretrained" on 10 classes
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    model.fc = nn.Linear(16, 5)                        # new task head, added after the optimizer
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(images, labels), 32),
                loss_fn=nn.CrossEntropyLoss())


@case("mlp_dropout_as_keep_prob", "what_is_trained",
      "nn.Dropout(0.9) was meant as keep_prob=0.9 (TF1 habit) but PyTorch's p is the drop probability: 90% of the "
      "activations are zeroed", DROPOUT)
def mlp_dropout_as_keep_prob():
    seed()
    x, y = teacher_classes(1024, 20, 5)
    keep_prob = 0.9
    model = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Dropout(keep_prob),
                          nn.Linear(128, 128), nn.ReLU(), nn.Dropout(keep_prob), nn.Linear(128, 5))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.CrossEntropyLoss())


class SentimentDataset(Dataset):
    def __init__(self, n, length=24, vocab=200, s=0):
        g = torch.Generator().manual_seed(s)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        self.ids = torch.randint(5, vocab, (n, length), generator=g)
        self.ids[:, 0] = 2
        marks = torch.rand(n, length, generator=g) < 0.2
        marks[:, 0] = False
        self.ids = torch.where(marks, 3 + self.labels[:, None], self.ids)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


def _tiny_bert_config(**kw):
    from transformers import BertConfig
    return BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, **kw)


@case("bert_dropout_as_keep_prob", "what_is_trained",
      "hidden_dropout_prob=0.9 and attention_probs_dropout_prob=0.9 were set as keep probabilities: BERT drops 90% "
      "of its hidden activations and attention weights during training", DROPOUT)
def bert_dropout_as_keep_prob():
    from transformers import BertForSequenceClassification
    seed()
    model = BertForSequenceClassification(_tiny_bert_config(num_labels=2, hidden_dropout_prob=0.9,
                                                            attention_probs_dropout_prob=0.9))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    return dict(model=model, optimizer=optimizer, train_loader=loader(SentimentDataset(256), 16),
                val_loader=loader(SentimentDataset(64, s=1), 32, shuffle=False), loss_fn=None)


class LMSeqs(Dataset):
    def __init__(self, n, length, vocab, s=0):
        self.ids = token_sequences(n, length, vocab, s)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@case("gpt2_tied_head_replaced", "what_is_trained",
      "the config says tie_word_embeddings=True but lm_head was replaced by a fresh nn.Linear, so the head no longer "
      "shares the input embedding: the run trains untied weights that a reload through the config would re-tie",
      TIED)
def gpt2_tied_head_replaced():
    from transformers import GPT2Config, GPT2LMHeadModel
    seed()
    config = GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    model = GPT2LMHeadModel(config)
    model.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)    # "re-initialise the head"
    nn.init.normal_(model.lm_head.weight, std=0.02)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    return dict(model=model, optimizer=optimizer, train_loader=loader(LMSeqs(256, 32, 96), 16), loss_fn=None)


class MLMDataset(Dataset):
    def __init__(self, n, length=24, vocab=200, s=0):
        self.ids = token_sequences(n, length, vocab, s, low=5)
        self.g = torch.Generator().manual_seed(s + 1)
        self.masks = torch.rand(n, length, generator=self.g) < 0.15
        self.masks[:, 5] = True

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids, mask = self.ids[i], self.masks[i]
        return {"input_ids": ids.masked_fill(mask, 4), "attention_mask": torch.ones_like(ids),
                "labels": ids.masked_fill(~mask, -100)}


@case("bert_mlm_decoder_rebuilt_untied", "what_is_trained",
      "BertForMaskedLM's decoder is rebuilt as a new nn.Linear while the config keeps tie_word_embeddings=True: "
      "output and input embeddings are silently untied", TIED)
def bert_mlm_decoder_rebuilt_untied():
    from transformers import BertForMaskedLM
    seed()
    config = _tiny_bert_config(tie_word_embeddings=True)
    model = BertForMaskedLM(config)
    model.cls.predictions.decoder = nn.Linear(config.hidden_size, config.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    return dict(model=model, optimizer=optimizer, train_loader=loader(MLMDataset(256), 16), loss_fn=None)


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.3), nn.Linear(32, 6))

    def forward(self, x):
        return self.net(x)


def evaluate(model, val_loader):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in val_loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    return correct / total


@case("cnn_left_in_eval_after_baseline", "what_is_trained",
      "a baseline evaluate() puts the model in eval() before training and nothing calls model.train(): BatchNorm "
      "uses its running statistics and dropout is off for the whole run", EVAL)
def cnn_left_in_eval_after_baseline():
    seed()
    images, labels = _colour_images(512, 6, s=2)
    vi, vl = _colour_images(128, 6, s=3)
    model = BNNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    val_loader = loader(TensorDataset(vi, vl), 64, shuffle=False)
    evaluate(model, val_loader)                       # "accuracy before training"
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(images, labels), 32),
                val_loader=val_loader, loss_fn=nn.CrossEntropyLoss())


@case("bert_left_in_eval_after_sanity_check", "what_is_trained",
      "model.eval() for a sanity prediction before the loop is never undone, so BERT trains with dropout off",
      EVAL)
def bert_left_in_eval_after_sanity_check():
    from transformers import BertForSequenceClassification
    seed()
    model = BertForSequenceClassification(_tiny_bert_config(num_labels=2))
    data = SentimentDataset(256, s=4)
    model.eval()
    with torch.no_grad():
        sample = data[0]
        model(input_ids=sample["input_ids"][None], attention_mask=sample["attention_mask"][None])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    return dict(model=model, optimizer=optimizer, train_loader=loader(data, 16), loss_fn=None)
