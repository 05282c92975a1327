"""Set ag, family what_is_trained: the weights that should learn are frozen, cut from the graph, zeroed or not the
ones the optimizer holds, with no error."""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

from benchmarks.blind_preflight_ag.cases_shapes import FILLER
from benchmarks.blind_preflight_ag.cases_targets import DictDataset
from benchmarks.blind_preflight_ag.registry import (
    acc_of,
    build_vocab,
    case,
    choice,
    encode,
    fix,
    fixed_of,
    gen,
    loader,
    next_token_acc,
    pad_to,
    seed,
    token_sequences,
    words,
)

POS, NEG = words("pos", 40), words("neg", 40)


def polarity_reviews(n: int, s: int, length: int = 12, min_length: int | None = None):
    """Filler words with three sentiment words from 80 (length words, or min_length..length); label: the majority
    polarity."""
    g = gen(s)
    texts, labels = [], []
    for _ in range(n):
        k = length if min_length is None else int(torch.randint(min_length, length + 1, (1,), generator=g))
        toks = choice(g, FILLER, k)
        label = int(torch.rand(1, generator=g) < 0.5)
        votes = [label, label, int(torch.rand(1, generator=g) < 0.5)]
        for pos, v in zip(torch.randperm(k, generator=g)[:3].tolist(), votes):
            toks[pos] = choice(g, POS if v else NEG)
        texts.append(" ".join(toks))
        labels.append(label)
    return texts, torch.tensor(labels)


# ---------------------------------------------------------------------------------------------- from_pretrained

class MeanEmbeddingClassifier(nn.Module):
    def __init__(self, vectors: torch.Tensor, freeze: bool):
        super().__init__()
        self.emb = nn.Embedding.from_pretrained(vectors, freeze=freeze, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(vectors.shape[1], 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, ids):
        mask = (ids != 0).unsqueeze(-1).float()
        return self.mlp((self.emb(ids) * mask).sum(1) / mask.sum(1).clamp_min(1.0))


@case("ag_embedding_from_pretrained_frozen", "what_is_trained",
      "A review classifier initialises its word vectors with nn.Embedding.from_pretrained(vectors, padding_idx=0) from "
      "the user's own 16-d word2vec run on a small unlabelled corpus (vectors that carry no sentiment), meaning to "
      "fine-tune them; from_pretrained defaults to freeze=True, so the ~2,300 embedding weights never move and "
      "only the small MLP on their mean learns (fix: from_pretrained(..., freeze=False)).",
      r"from_pretrained.{0,120}(freeze|frozen|requires_grad)|freeze\s*=\s*(true|false)"
      r"|(embedding|word vectors?|emb\w*\.weight).{0,100}(frozen|requires_grad\s*=?\s*false|not (trainable|updated|"
      r"train\w*)|never (updated|train\w*|change))")
def ag_embedding_from_pretrained_frozen(fixed: bool = False):
    seed(0)
    texts, y = polarity_reviews(2000, 61)
    vocab = build_vocab(texts[:1600])
    vectors = torch.randn(len(vocab), 16, generator=gen(62))            # the user's quick word2vec vectors
    vectors[0] = 0
    ids = pad_to([encode(t, vocab) for t in texts], 12)
    model = MeanEmbeddingClassifier(vectors, freeze=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(ids[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(ids[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("ag_embedding_from_pretrained_frozen", fixed_of(ag_embedding_from_pretrained_frozen),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=200)


# ---------------------------------------------------------------------------------------------- stale optimizer

def three_way_reviews(n: int, s: int, length: int = 14):
    """Ids [CLS] words: label 0/1/2 = negative / neutral / positive from the sentiment words present."""
    g = gen(s)
    ids = torch.randint(10, 60, (n, length), generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    for i in range(n):
        spots = torch.randperm(length - 1, generator=g)[:2] + 1
        if y[i] == 0:
            ids[i, spots] = torch.randint(60, 70, (2,), generator=g)
        elif y[i] == 2:
            ids[i, spots] = torch.randint(70, 80, (2,), generator=g)
        ids[i, 0] = 1
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=y)


def small_bert(**kw):
    base = dict(vocab_size=80, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    base.update(kw)
    return BertConfig(**base)


@case("ag_optimizer_holds_discarded_model", "what_is_trained",
      "A notebook builds BertForSequenceClassification(config) and its AdamW optimizer, then finds the data has three "
      "sentiment classes, sets config.num_labels = 3 and rebuilds model = BertForSequenceClassification(config) "
      "without rebuilding the optimizer: the optimizer still holds the first model's parameters, so the model that is "
      "trained and evaluated keeps its random initial weights while its gradients pile up unused (fix: create the "
      "optimizer after the final model, AdamW(model.parameters(), ...)).",
      r"(stale|old|previous|discarded|earlier|first|another|different|other|replaced|re-?created|rebuilt) "
      r"(model|module|instance|network)('s)? ?(parameters|weights)?.{0,80}optimi[sz]er"
      r"|optimi[sz]er.{0,100}(stale|old|previous|discarded|earlier|first|another|different|other|replaced) "
      r"(model|module|instance|network|parameters)"
      r"|none of (the )?(model'?s? |its )?(parameters|weights).{0,60}optimi[sz]er"
      r"|optimi[sz]er.{0,60}none of (the )?(model'?s? |its )?(parameters|weights)"
      r"|(re-?create|re-?build|build|create|construct) the optimi[sz]er after"
      r"|model (was |is )?(re-?created|re-?built|re-?instantiated|replaced) after (the )?optimi[sz]er")
def ag_optimizer_holds_discarded_model(fixed: bool = False):
    seed(0)
    config = small_bert(num_labels=2)
    model = BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    config.num_labels = 3                                              # the data turned out to have 3 classes
    model = BertForSequenceClassification(config)
    if fixed:
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    train, val = three_way_reviews(1200, 71), three_way_reviews(300, 72)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(DictDataset(**train), 32),
                val_loader=loader(DictDataset(**val), 100, shuffle=False),
                loss_fn=None, max_steps=300)


fix("ag_optimizer_holds_discarded_model", fixed_of(ag_optimizer_holds_discarded_model),
    acc_of(lambda m, b: (m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1),
                         b["labels"])), "val accuracy", steps=100)


# ---------------------------------------------------------------------------------------------- padding_idx

def support_tickets(n: int, s: int):
    """Ticket texts (6-14 filler words); billing tickets mention 'refund' two or three times."""
    g = gen(s)
    texts, labels = [], []
    for _ in range(n):
        toks = choice(g, FILLER, int(torch.randint(6, 15, (1,), generator=g)))
        label = int(torch.rand(1, generator=g) < 0.5)
        if label:
            for _ in range(int(torch.randint(2, 4, (1,), generator=g))):
                toks.insert(int(torch.randint(0, len(toks) + 1, (1,), generator=g)), "refund")
        texts.append(" ".join(toks))
        labels.append(label)
    return texts, labels


class BagClassifier(nn.Module):
    """The torchtext text-classification tutorial's model: EmbeddingBag over a flat id list with offsets."""

    def __init__(self, vocab: int, d: int = 32, padding_idx: int | None = 0):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, d, mode="mean", padding_idx=padding_idx)
        self.fc = nn.Linear(d, 2)

    def forward(self, text, offsets):
        return self.fc(self.bag(text, offsets))


def bag_collate(vocab):
    def collate(rows):
        ids = [torch.tensor([vocab[w] for w in t.split()]) for t, _ in rows]
        offsets = torch.tensor([0] + [len(x) for x in ids[:-1]]).cumsum(0)
        return torch.cat(ids), offsets, torch.tensor([y for _, y in rows])
    return collate


@case("ag_padding_idx_is_a_real_word", "what_is_trained",
      "A ticket router (EmbeddingBag with offsets, as in the torchtext tutorial, so nothing is ever padded) builds its "
      "vocabulary with enumerate(Counter(...).most_common()), so the commonest word, 'refund', gets id 0, and keeps "
      "padding_idx=0 from a padded-batch template: EmbeddingBag drops id 0 from every bag and its row gets no "
      "gradient, so the one word that marks billing tickets is invisible (fix: padding_idx=None here, or reserve id 0 "
      "for a real <pad> token).",
      r"padding_idx.{0,140}(real|actual|frequent|commonest|most common|valid|vocabulary|meaningful) "
      r"(word|token|id)|(real|actual|frequent|commonest|most common|valid) (word|token).{0,100}padding_idx"
      r"|padding_idx\s*=\s*none|padding_idx.{0,80}(no padding|never padded|not padded|without padding)"
      r"|(id|index) 0.{0,80}(is|=|means) .{0,20}(word|token).{0,60}(pad|zero)")
def ag_padding_idx_is_a_real_word(fixed: bool = False):
    seed(0)
    texts, y = support_tickets(1800, 81)
    counts = Counter(w for t in texts[:1400] for w in t.split())
    vocab = {w: i for i, (w, _) in enumerate(counts.most_common())}
    vocab.update({w: len(vocab) + i for i, w in enumerate(sorted(set(FILLER) - set(vocab)))})
    model = BagClassifier(len(vocab), padding_idx=None if fixed else 0)
    rows = list(zip(texts, y))

    def bag_loss(m, batch):
        text, offsets, labels = batch
        return F.cross_entropy(m(text, offsets), labels)

    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=2.0),
                train_loader=loader(rows[:1400], 32, collate_fn=bag_collate(vocab)),
                val_loader=loader(rows[1400:], 100, shuffle=False, collate_fn=bag_collate(vocab)),
                loss_fn=bag_loss, max_steps=500)


fix("ag_padding_idx_is_a_real_word", fixed_of(ag_padding_idx_is_a_real_word),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val accuracy", steps=200)


# ---------------------------------------------------------------------------------------------- detached encoder

class GRUClassifier(nn.Module):
    def __init__(self, vocab: int, d: int = 32, detach_features: bool = False):
        super().__init__()
        self.detach_features = detach_features
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.head = nn.Linear(d, 2)

    def features(self, ids):
        h = self.gru(self.emb(ids))[1][-1]
        return h.detach() if self.detach_features else h      # copied from a "feature extraction" helper

    def forward(self, ids):
        return self.head(self.features(ids))


@case("ag_encoder_features_detached", "what_is_trained",
      "A GRU review classifier computes its sentence vector through a features() helper that ends in .detach() (it "
      "was copied from a script that cached frozen features for a probe): the embeddings and the GRU are cut from the "
      "graph, receive no gradient and stay random, and only the final Linear head learns on random features (fix: "
      "drop .detach() from the features used in training).",
      r"\.?detach\(\)|detach\w*|(cut|disconnect\w*|removed?) from (the )?(autograd |computation )?graph"
      r"|outside (the )?(autograd |computation )?graph")
def ag_encoder_features_detached(fixed: bool = False):
    seed(0)
    texts, y = polarity_reviews(1800, 91)
    vocab = build_vocab(texts[:1400])
    ids = pad_to([encode(t, vocab) for t in texts], 12)
    model = GRUClassifier(len(vocab), detach_features=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(ids[:1400], y[:1400]), 32),
                val_loader=loader(TensorDataset(ids[1400:], y[1400:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("ag_encoder_features_detached", fixed_of(ag_encoder_features_detached),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=150)


# ---------------------------------------------------------------------------------------------- tied LM head

def gpt2_config(**kw):
    base = dict(vocab_size=40, n_embd=48, n_layer=2, n_head=4, n_positions=32, bos_token_id=1, eos_token_id=2,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    base.update(kw)
    return GPT2Config(**base)


@case("ag_gpt2_tied_head_frozen_by_name", "what_is_trained",
      "To adapt a small GPT-2 cheaply the script freezes every parameter whose name does not start with 'lm_head' or "
      "'transformer.ln_f'; GPT-2 ties lm_head.weight to transformer.wte.weight, and named_parameters() lists the "
      "shared matrix once, as transformer.wte.weight, so the LM head is frozen with the embeddings and only ln_f's "
      "96 weights train (fix: untie with GPT2Config(tie_word_embeddings=False), or set "
      "model.lm_head.weight.requires_grad_(True) after the loop).",
      r"\btie\w*|\btied\b|shared (weight|matrix|parameter|embedding)|tie_word_embeddings"
      r"|lm_head.{0,120}(wte|embedding|frozen|requires_grad|named_parameters)"
      r"|named_parameters\(\).{0,120}(once|dedup\w*|lists? .{0,30}only|shared)")
def ag_gpt2_tied_head_frozen_by_name(fixed: bool = False):
    seed(0)
    model = GPT2LMHeadModel(gpt2_config(tie_word_embeddings=not fixed))
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith("lm_head") or name.startswith("transformer.ln_f")
    ids = token_sequences(2000, 16, 40, s=101)
    train = dict(input_ids=ids[:1700], labels=ids[:1700])
    val = dict(input_ids=ids[1700:], labels=ids[1700:])
    return dict(model=model, optimizer=torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2),
                train_loader=loader(DictDataset(**train), 32),
                val_loader=loader(DictDataset(**val), 100, shuffle=False),
                loss_fn=None, max_steps=400)


fix("ag_gpt2_tied_head_frozen_by_name", fixed_of(ag_gpt2_tied_head_frozen_by_name),
    lambda m, kw: next_token_acc(m, kw, key="input_ids"), "val next-token accuracy", steps=150)
