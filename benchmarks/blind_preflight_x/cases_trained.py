"""What is trained: parts of the model the optimizer never moves, or moves on the wrong signal."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_x.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    seed,
    teacher_classes,
)

# --- 1. multi-task: the main head reads the shared encoder through .detach() ------------------------------------------


def _topic_docs(n, s, length=16):
    """Documents of 16 token ids (1..60, 0 = pad, lengths 6..16). Topic (main task): a token of group A (ids 1, 2)
    present XOR one of group B (ids 9, 10) present; auxiliary task: the document length."""
    g = gen(s)
    x = torch.randint(17, 61, (n, length), generator=g)
    has_a = torch.rand(n, generator=g) < 0.5
    has_b = torch.rand(n, generator=g) < 0.5
    x[has_a, 2] = torch.randint(1, 3, (int(has_a.sum()),), generator=g)
    x[has_b, 4] = torch.randint(9, 11, (int(has_b.sum()),), generator=g)
    lengths = torch.randint(6, length + 1, (n,), generator=g)
    x[torch.arange(length).expand(n, length) >= lengths[:, None]] = 0
    return x, (has_a ^ has_b).long(), lengths.float() / length


class TopicAndLength(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.EmbeddingBag(61, 32, mode="sum", padding_idx=0)
        self.shared = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8), nn.ReLU())
        self.topic_head = nn.Linear(8, 2)
        self.length_head = nn.Linear(8, 1)

    def forward(self, x):
        h = self.shared(self.emb(x))
        # copied from a "stop the auxiliary task from hurting the main one" snippet, on the wrong branch
        topic = self.topic_head(h if self.fixed else h.detach())
        return topic, self.length_head(h).squeeze(-1)


def multitask_loss(model, batch):
    x, topic, length = batch
    topic_logits, length_pred = model(x)
    return F.cross_entropy(topic_logits, topic) + 0.5 * F.mse_loss(length_pred, length)


@case("wt_multitask_main_head_on_detached_encoder", "what_is_trained",
      bug="In the two-head model the topic (main) head reads the shared encoder through h.detach(), so the topic "
          "loss never reaches the shared layers: they are trained by the auxiliary length loss only and the main "
          "head is a linear probe on features built for another task.",
      cause_pattern=r"detach.{0,200}(head|encoder|shared|branch|main|topic)|(topic|main).{0,100}(head|loss).{0,120}"
                    r"(never reaches|does not reach|no gradient|not backprop)|(shared|encoder).{0,120}(only|solely) "
                    r"(by|from) (the )?(auxiliary|aux|length)")
def wt_detach(fixed=False):
    seed(0)
    x, topic, length = _topic_docs(2400, 31)
    model = TopicAndLength(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:2000], topic[:2000], length[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], topic[2000:], length[2000:]), 200, shuffle=False),
                loss_fn=multitask_loss, max_steps=300)


fix("wt_multitask_main_head_on_detached_encoder", fixed_of(wt_detach),
    acc_of(lambda m, b: (m(b[0])[0].argmax(-1), b[1])), "val topic accuracy", steps=300)

# --- 2. a projection layer built inside forward ----------------------------------------------------------------------


def _nli_pairs(n, s):
    """Premise / hypothesis sentence vectors; 3 relations from a random teacher on their difference and product."""
    g = gen(s)
    a = torch.randn(n, 12, generator=g)
    b = torch.randn(n, 12, generator=g)
    _, y = teacher_classes(n, 24, 3, s + 1)
    w = torch.randn(24, 3, generator=g)
    y = (torch.cat([a - b, a * b], 1) @ w).argmax(1)
    return torch.cat([a, b], 1), y


class PairClassifier(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.encoder = nn.Sequential(nn.Linear(48, 64), nn.ReLU())
        if fixed:
            self.proj = nn.Linear(64, 3)

    def features(self, x):
        a, b = x[:, :12], x[:, 12:]
        return torch.cat([a, b, a - b, a * b], 1)

    def forward(self, x):
        h = self.encoder(self.features(x))
        if self.fixed:
            return self.proj(h)
        proj = nn.Linear(h.size(-1), 3).to(h.device)   # "the head adapts to whatever width the encoder has"
        return proj(h)


@case("wt_projection_layer_built_in_forward", "what_is_trained",
      bug="The output projection is created with nn.Linear(...) inside forward(), so every call builds a fresh "
          "randomly initialised layer that is not a registered submodule, not in model.parameters() and not in the "
          "optimizer: the classifier head is never trained and changes at every step.",
      cause_pattern=r"(inside|in) (the )?forward|(created|built|instantiated|constructed|defined) (in|inside|during|on "
                    r"every call to) (the )?forward|(not|never) (a )?registered.{0,80}(module|layer|parameter)|"
                    r"fresh(ly)? (random(ly)?)? ?(initiali[sz]ed )?(layer|linear|weights)")
def wt_in_forward(fixed=False):
    seed(0)
    x, y = _nli_pairs(2400, 32)
    model = PairClassifier(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=250)


fix("wt_projection_layer_built_in_forward", fixed_of(wt_in_forward),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)

# --- 3. binary hash codes through a hard threshold (no straight-through estimator) -----------------------------------


class HashClassifier(nn.Module):
    """Semantic-hashing style: 16-bit binary codes of the document vector, then a linear classifier."""

    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
        self.classifier = nn.Linear(16, 8)

    def forward(self, x):
        s = torch.tanh(self.encoder(x))
        bits = (s > 0).float()
        if self.fixed:
            bits = s + (bits - s).detach()        # straight-through estimator
        return self.classifier(bits)


@case("wt_hash_bits_hard_threshold_no_ste", "what_is_trained",
      bug="The hashing layer binarises its codes with (s > 0).float(), which has no gradient: the encoder below it "
          "never receives a gradient and stays at its random initialisation, only the linear classifier on random "
          "bits is trained; a straight-through estimator (s + (bits - s).detach()) is needed.",
      cause_pattern=r"straight[- ]through|\bSTE\b|(threshold|binari[sz]|> ?0\)\.float|sign\(|round\().{0,160}"
                    r"(no gradient|zero gradient|not differentiable|non-differentiable|blocks?|cuts?)|"
                    r"(encoder|layers?) (below|before|upstream).{0,80}(never|no) (receives?|gets?) (a )?gradient")
def wt_hash(fixed=False):
    seed(0)
    x, y = teacher_classes(2600, 32, 8, 33)
    model = HashClassifier(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2200], y[:2200]), 32),
                val_loader=loader(TensorDataset(x[2200:], y[2200:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("wt_hash_bits_hard_threshold_no_ste", fixed_of(wt_hash),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)

# --- 4. the encoder call wrapped in torch.no_grad() inside forward ---------------------------------------------------


def _order_docs(n, s, length=14):
    """Label: does token 3 come before token 4 (both always present)."""
    g = gen(s)
    x = torch.randint(5, 50, (n, length), generator=g)
    idx = torch.stack([torch.randperm(length, generator=g)[:2] for _ in range(n)])
    x[torch.arange(n), idx[:, 0]] = 3
    x[torch.arange(n), idx[:, 1]] = 4
    return x, (idx[:, 0] < idx[:, 1]).long()


class FrozenByAccident(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(50, 16)
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.head = nn.Linear(32, 2)

    def encode(self, x):
        _, h = self.gru(self.emb(x))
        return h[-1]

    def forward(self, x):
        if self.fixed:
            h = self.encode(x)
        else:
            with torch.no_grad():                 # pasted from the feature-extraction script
                h = self.encode(x)
        return self.head(h)


@case("wt_encoder_called_under_no_grad", "what_is_trained",
      bug="forward() runs the embedding and GRU encoder inside a torch.no_grad() block pasted from the "
          "feature-extraction script, so no graph is recorded for them: their parameters are in the optimizer but "
          "never get a gradient, and only the linear head on random GRU features trains.",
      cause_pattern=r"no_grad|inference_mode|set_grad_enabled\(false\)|(no|without) (autograd )?graph.{0,80}"
                    r"(encoder|gru|embedding)|(encoder|gru|embedding).{0,120}(never|no) (gets?|receives?) (a )?grad")
def wt_no_grad(fixed=False):
    seed(0)
    x, y = _order_docs(2000, 34)
    model = FrozenByAccident(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1700], y[:1700]), 32),
                val_loader=loader(TensorDataset(x[1700:], y[1700:]), 150, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("wt_encoder_called_under_no_grad", fixed_of(wt_no_grad),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)

# --- 5. the most frequent word gets id 0, which is also padding_idx --------------------------------------------------

WORDS = ["not", "good", "bad", "great", "awful"] + [f"w{i}" for i in range(40)]


def _reviews_text(n, s):
    """Word lists: one polarity word (good/great vs bad/awful), 'not' in half the reviews (and it is the most
    frequent word overall), fillers; the label flips with 'not'."""
    g = gen(s)
    docs, labels = [], []
    for _ in range(n):
        length = int(torch.randint(5, 11, (1,), generator=g))
        words = [WORDS[5 + int(i)] for i in torch.randint(0, 40, (length,), generator=g)]
        pol = int(torch.randint(0, 4, (1,), generator=g))
        words[int(torch.randint(0, length, (1,), generator=g))] = WORDS[1 + pol]
        positive = pol in (0, 2)
        if torch.rand(1, generator=g) < 0.5:
            for _ in range(3):
                words.insert(int(torch.randint(0, len(words), (1,), generator=g)), "not")
            positive = not positive
        docs.append(words)
        labels.append(int(positive))
    return docs, torch.tensor(labels)


def build_vocab(docs, fixed):
    from collections import Counter
    counts = Counter(w for d in docs for w in d)
    start = 1 if fixed else 0                      # keras Tokenizer habit: index 0 is kept for padding
    return {w: i + start for i, (w, _) in enumerate(counts.most_common())}


def encode(docs, vocab, length=14):
    x = torch.zeros(len(docs), length, dtype=torch.long)
    for i, d in enumerate(docs):
        ids = [vocab[w] for w in d][:length]
        x[i, :len(ids)] = torch.tensor(ids)
    return x


class MeanPoolMLP(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, 24, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(24, 48), nn.ReLU(), nn.Linear(48, 2))

    def forward(self, x):
        mask = (x != 0).unsqueeze(-1).float()
        pooled = (self.emb(x) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.mlp(pooled * 4)


@case("wt_most_frequent_word_is_padding_idx", "what_is_trained",
      bug="The vocabulary is numbered from 0 by frequency, so the most frequent word ('not') gets id 0, which is also "
          "nn.Embedding's padding_idx and the pad value: its embedding row is fixed at zero and never updated, and the "
          "pooling mask drops it as padding, so the model cannot see negation.",
      cause_pattern=r"padding_idx.{0,200}(real|frequent|word|token|collid|same id|also)|(id|index) 0.{0,120}"
                    r"(padding|pad).{0,80}(word|token|also|both)|(most )?frequent (word|token).{0,120}(id|index) 0|"
                    r"(id|index) 0.{0,60}(also|same as|shared with).{0,40}(padding_idx|pad)|(pad|padding) (id|index|"
                    r"token).{0,80}(collid|shared with|same as|also) .{0,40}(word|token)|(word|token|it).{0,80}"
                    r"(treated|masked|dropped|drops? it) as (padding|pad)")
def wt_pad_collision(fixed=False):
    seed(0)
    docs, y = _reviews_text(2200, 35)
    vocab = build_vocab(docs[:1800], fixed)
    x = encode(docs, vocab)
    model = MeanPoolMLP(len(vocab) + 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1800], y[:1800]), 32),
                val_loader=loader(TensorDataset(x[1800:], y[1800:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("wt_most_frequent_word_is_padding_idx", fixed_of(wt_pad_collision),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)
