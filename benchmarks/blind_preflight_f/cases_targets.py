"""Set f, family `targets`: what the loss is trained towards (encoding, range, leakage, masking / ignore)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_f.registry import case, loader, seed

# --------------------------------------------------------------------------- 1: 'same' padded conv forecaster


def load_curves(n=1200, length=65, s=0):
    g = torch.Generator().manual_seed(s)
    t = torch.arange(length).float()
    f1 = 0.1 + 0.2 * torch.rand(n, 1, generator=g)
    f2 = 0.3 + 0.3 * torch.rand(n, 1, generator=g)
    ph = 6.28 * torch.rand(n, 2, generator=g)
    x = torch.sin(f1 * t + ph[:, :1]) + 0.5 * torch.sin(f2 * t + ph[:, 1:])
    return x + 0.3 * torch.randn(n, length, generator=g)


class ConvForecaster(nn.Module):
    def __init__(self, c=32, k=5):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(1, c, k, padding=k // 2), nn.ReLU(), nn.Conv1d(c, c, k, padding=k // 2),
                                 nn.ReLU(), nn.Conv1d(c, 1, 1))

    def forward(self, x):                     # (B, L) -> (B, L): a forecast of the next value at every position
        return self.net(x.unsqueeze(1)).squeeze(1)


def next_step_mse(model, batch):
    series = batch[0]
    return F.mse_loss(model(series[:, :-1]), series[:, 1:])


@case("load_forecaster_same_padded_conv_sees_next_value", "targets",
      "the many-to-many forecaster predicts series[t + 1] at every position t with Conv1d(kernel 5, padding=2) layers: "
      "'same' padding is symmetric, so the output at t reads inputs t+1 .. t+4, the very values it is asked to "
      "forecast; the loss falls far below the noise floor by copying the next input and the model cannot forecast "
      "(left-only / causal padding is the fix)",
      r"causal|future|look.?ahead|leak|(next|later|subsequent|upcoming) (step|time|value|position|input)|padding[^.]*(symmetric|both sides|cent(er|re)d|same)|receptive field|(targets?|labels?)[^.]*(visible|in the input|seen|part of the input)")
def load_forecaster_same_padded_conv_sees_next_value():
    seed(0)
    x = load_curves(s=11)
    model = ConvForecaster()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1000]), 32),
                val_loader=loader(TensorDataset(x[1000:]), 100, shuffle=False),
                loss_fn=next_step_mse, max_steps=2000)


# --------------------------------------------------------------------------- 2: word tags vs sub-word tokens


N_WORDS, N_TAGS = 60, 5


def lexicon(s=0):
    """Each word: its tag and its sub-word pieces (1-3 piece ids, unique to the word)."""
    g = torch.Generator().manual_seed(s)
    tags = torch.randint(0, N_TAGS, (N_WORDS,), generator=g).tolist()
    pieces, next_id = [], 1
    for w in range(N_WORDS):
        k = int(torch.randint(1, 4, (1,), generator=g))
        pieces.append(list(range(next_id, next_id + k)))
        next_id += k
    return tags, pieces, next_id


class WordTaggedSentences(Dataset):
    def __init__(self, n, s=0):
        self.tags, self.pieces, self.vocab = lexicon(s=100)
        g = torch.Generator().manual_seed(s)
        self.sentences = [torch.randint(0, N_WORDS, (int(torch.randint(6, 11, (1,), generator=g)),), generator=g).tolist()
                          for _ in range(n)]

    def __len__(self):
        return len(self.sentences)

    def __getitem__(self, i):
        words = self.sentences[i]
        input_ids = [p for w in words for p in self.pieces[w]]
        labels = [self.tags[w] for w in words]
        labels = labels + [-100] * (len(input_ids) - len(labels))
        return torch.tensor(input_ids), torch.tensor(labels)


def pad_pairs(batch):
    return (pad_sequence([b[0] for b in batch], batch_first=True, padding_value=0),
            pad_sequence([b[1] for b in batch], batch_first=True, padding_value=-100))


class GRUTagger(nn.Module):
    def __init__(self, vocab=200, d=48, tags=N_TAGS):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * d, tags)

    def forward(self, ids):
        return self.out(self.gru(self.embed(ids))[0])


def token_ce(model, batch):
    ids, labels = batch
    logits = model(ids)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)


@case("ner_word_tags_not_aligned_to_subword_pieces", "targets",
      "each word is split into 1-3 sub-word pieces, but the Dataset keeps one tag per word and pads the tag list with "
      "-100 to the number of pieces: tag j is put on piece j, not on word j's first piece, so after the first multi-piece "
      "word every tag sits on a piece of another word (align with word_ids: the tag on each word's first piece, -100 "
      "on the rest)",
      r"align|word_ids|sub.?word|word.?piece|pieces?|(labels?|tags?)[^.]*(shift|offset|misalign|wrong tokens?|do not match|don't match|belong to (other|another|different))|(first|continuation) (sub)?tokens?")
def ner_word_tags_not_aligned_to_subword_pieces():
    seed(0)
    train, val = WordTaggedSentences(1600, s=12), WordTaggedSentences(400, s=13)
    model = GRUTagger(vocab=train.vocab)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, collate_fn=pad_pairs),
                val_loader=loader(val, 100, shuffle=False, collate_fn=pad_pairs),
                loss_fn=token_ce, max_steps=2000)


# --------------------------------------------------------------------------- 3: multi-label tag lists padded with 0


N_PHOTO_TAGS = 8


def photo_tag_lists(n=3000, d=24, s=0):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, N_PHOTO_TAGS, generator=g) / d ** 0.5
    present = (x @ w) > 0.9
    return x, [torch.nonzero(row).flatten() for row in present]


class TaggedPhotos(Dataset):
    def __init__(self, x, tag_lists):
        self.x, self.tag_lists = x, tag_lists

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.tag_lists[i]


def multihot_collate(batch):
    x = torch.stack([b[0] for b in batch])
    tag_ids = pad_sequence([b[1] for b in batch], batch_first=True, padding_value=0)
    targets = torch.zeros(len(batch), N_PHOTO_TAGS).scatter_(1, tag_ids, 1.0)
    return x, targets


@case("photo_tag_lists_padded_with_zero_mark_tag_0", "targets",
      "the variable-length tag lists are padded with 0 (pad_sequence(padding_value=0)) and turned into multi-hot "
      "targets with scatter_: the padding id 0 is also the tag 'people', so tag 0 is set for almost every photo "
      "(every photo with fewer tags than the longest of its batch) and its head learns to always say yes",
      r"(tag|class|label|column|target|output) ?(id )?(#)?0\b|(pad|padding)[^.]*(value|id|index|collid|same as|also)[^.]*(tag|class|label)|(tag|class|label|column|target)s?[^.]*(always|nearly always|almost always|every (row|sample|example)|constant)[^.]*(1\b|one|positive|set|present)|(positive|prevalence|rate)[^.]*(0\.9\d|9\d ?%|100 ?%)")
def photo_tag_lists_padded_with_zero_mark_tag_0():
    seed(0)
    x, tags = photo_tag_lists(s=14)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, N_PHOTO_TAGS))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TaggedPhotos(x[:2560], tags[:2560]), 64, collate_fn=multihot_collate),
                val_loader=loader(TaggedPhotos(x[2560:], tags[2560:]), 110, shuffle=False, collate_fn=multihot_collate),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 4: GPT-2, pad token = EOS


EOS = 2


def counting_up_sequences(n=1400, T=24, s=0, pad_id=EOS):
    """Progressions from a small start in steps of 1-3 that end (EOS) before passing 28; then padding."""
    g = torch.Generator().manual_seed(s)
    ids = torch.full((n, T), pad_id, dtype=torch.long)
    att = torch.zeros(n, T, dtype=torch.long)
    for i in range(n):
        v, step = int(torch.randint(3, 12, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
        seq = []
        while v <= 28 and len(seq) < T - 1:
            seq.append(v)
            v += step
        seq.append(EOS)
        ids[i, :len(seq)] = torch.tensor(seq)
        att[i, :len(seq)] = 1
    return ids, att


class DictDataset(Dataset):
    def __init__(self, **tensors):
        self.tensors = tensors

    def __len__(self):
        return len(next(iter(self.tensors.values())))

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.tensors.items()}


def tiny_gpt2(pad_id):
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                      pad_token_id=pad_id, bos_token_id=1, eos_token_id=EOS))


@case("gpt2_pad_token_set_to_eos_then_masked", "targets",
      "following the usual 'tokenizer.pad_token = tokenizer.eos_token', padding uses the EOS id, and the labels are "
      "input_ids with -100 wherever input_ids == pad_token_id: that also removes every real EOS from the targets, so "
      "the model is never trained to end a sequence and generation never stops (mask by attention_mask, or use a "
      "separate pad token)",
      r"\beos\b|end.of.(sequence|text|sentence)|(pad|padding)[^.]*(token|id)[^.]*(same|equal|identical|also|eos)|never[^.]*(emit|generate|predict|produce)[^.]*(end|stop)|(stop|end) token")
def gpt2_pad_token_set_to_eos_then_masked():
    seed(0)
    ids, att = counting_up_sequences(s=15)
    labels = ids.masked_fill(ids == EOS, -100)
    model = tiny_gpt2(pad_id=EOS)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(DictDataset(input_ids=ids[:1200], attention_mask=att[:1200], labels=labels[:1200]), 32),
                val_loader=loader(DictDataset(input_ids=ids[1200:], attention_mask=att[1200:], labels=labels[1200:]), 100,
                                  shuffle=False),
                loss_fn=None, max_steps=2000)


# --------------------------------------------------------------------------- 5: CosineEmbeddingLoss with 0/1 labels


def question_pairs(n=3000, T=10, intents=80, vocab=400, s=0):
    g = torch.Generator().manual_seed(s)
    keywords = torch.randint(10, vocab, (intents, 5), generator=g)

    def question(intent):
        ids = torch.randint(10, vocab, (len(intent), T), generator=g)
        pick = torch.rand(len(intent), 5, generator=g).argsort(1)[:, :4]
        ids[:, :4] = keywords[intent][torch.arange(len(intent))[:, None], pick]
        return ids[:, torch.randperm(T, generator=g)]
    ia = torch.randint(0, intents, (n,), generator=g)
    dup = torch.rand(n, generator=g) < 0.5
    ib = torch.where(dup, ia, (ia + torch.randint(1, intents, (n,), generator=g)) % intents)
    return question(ia), question(ib), dup.long()


class BagEncoder(nn.Module):
    def __init__(self, vocab=400, d=32):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, d, mode="mean")
        self.proj = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, ids):
        return self.proj(self.bag(ids))


def duplicate_loss(model, batch):
    qa, qb, is_dup = batch
    return F.cosine_embedding_loss(model(qa), model(qb), is_dup, margin=0.2)


@case("duplicate_questions_cosine_embedding_loss_0_1_labels", "targets",
      "CosineEmbeddingLoss needs targets +1 / -1, but the duplicate labels are the dataset's 0/1: pairs with target 0 "
      "contribute exactly zero loss, so the non-duplicates never push apart and the encoder is free to map every "
      "question to the same direction (cosine 1 for all pairs); is_dup * 2 - 1 is the fix",
      r"\{-1, ?1\}|-1 (and|or) \+?1\b|\+?1 (and|or) -1\b|±1|-1/\+?1|CosineEmbedding|(target|label)s?[^.]*\b0\b[^.]*(ignored|contribute|no (loss|gradient|effect)|zero loss)|(non.?duplicate|negative|dissimilar) pairs?[^.]*(ignored|never|no (loss|gradient|effect)|not (penali[sz]|push))|collaps")
def duplicate_questions_cosine_embedding_loss_0_1_labels():
    seed(0)
    qa, qb, dup = question_pairs(s=16)
    model = BagEncoder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(qa[:2560], qb[:2560], dup[:2560]), 64),
                val_loader=loader(TensorDataset(qa[2560:], qb[2560:], dup[2560:]), 110, shuffle=False),
                loss_fn=duplicate_loss, max_steps=2000)


# --------------------------------------------------------------------------- 6: target encoding that includes the row


def listings(n=3000, cats=1500, s=0):
    g = torch.Generator().manual_seed(s)
    cat = torch.randint(0, cats, (n,), generator=g)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, generator=g) / 8 ** 0.5
    effect = 0.5 * torch.randn(cats, generator=g)
    y = ((x @ w + effect[cat] + 0.6 * torch.randn(n, generator=g)) > 0).long()
    return cat, x, y


def with_neighbourhood_rate(cat, x, y):
    sums = torch.zeros(int(cat.max()) + 1).index_add_(0, cat, y.float())
    counts = torch.zeros(int(cat.max()) + 1).index_add_(0, cat, torch.ones(len(cat)))
    rate = sums[cat] / counts[cat]
    return torch.cat([x, rate[:, None]], 1)


@case("listing_target_encoding_includes_own_label", "targets",
      "the neighbourhood is target-encoded as the mean 'expensive' label of all listings in it, computed on the whole "
      "table before the split and including the listing's own label; neighbourhoods have ~2 listings, so the feature "
      "largely is the label: training and validation look excellent while real new listings (encoded from other rows "
      "only) are predicted far worse (out-of-fold / leave-one-out encoding from the training split is the fix)",
      r"leak|target.?encod|(mean|average|rate) (of )?(the )?(target|label)|(feature|column|input)[^.]*(derived|computed|built|made) from (the )?(target|label)|(label|target)[^.]*(in|into|inside|within) (the )?(inputs?|features?)|(feature|column)[^.]*(predicts|determines|reveals|encodes) the (label|target)")
def listing_target_encoding_includes_own_label():
    seed(0)
    cat, x, y = listings(s=17)
    feats = with_neighbourhood_rate(cat, x, y)
    model = nn.Sequential(nn.Linear(9, 64), nn.ReLU(), nn.Linear(64, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(feats[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(feats[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 7: denoiser trained towards its noisy input


def vibration_signals(n=3000, L=32, s=0):
    g = torch.Generator().manual_seed(s)
    t = torch.arange(L).float()
    f = 0.2 + 0.6 * torch.rand(n, 1, generator=g)
    ph = 6.28 * torch.rand(n, 1, generator=g)
    amp = 0.5 + torch.rand(n, 1, generator=g)
    return amp * torch.sin(f * t + ph)


class NoisySignals(Dataset):
    def __init__(self, clean, sigma=0.5, s=0):
        g = torch.Generator().manual_seed(s)
        self.clean = clean
        self.noisy = clean + sigma * torch.randn(clean.shape, generator=g)

    def __len__(self):
        return len(self.clean)

    def __getitem__(self, i):
        return self.noisy[i], self.clean[i]


def denoise_loss(model, batch):
    noisy, clean = batch
    return F.mse_loss(model(noisy), batch[0])


@case("vibration_denoiser_trained_towards_noisy_input", "targets",
      "the denoising autoencoder's loss compares its output with batch[0], the noisy input, instead of batch[1], the "
      "clean signal: the target is the input itself, the network learns the identity and removes no noise",
      r"identity|(targets?|labels?)[^.]*(equal|same as|identical to|copy of|is the) (the )?(inputs?|noisy)|(inputs?)[^.]*(equal|same as|identical to)[^.]*(targets?|labels?)|(reconstruct|predict|reproduc)\w*[^.]*(own|its) input|noisy[^.]*target|target[^.]*noisy|clean")
def vibration_denoiser_trained_towards_noisy_input():
    seed(0)
    clean = vibration_signals(s=18)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 32))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(NoisySignals(clean[:2560], s=1), 64),
                val_loader=loader(NoisySignals(clean[2560:], s=2), 110, shuffle=False),
                loss_fn=denoise_loss, max_steps=2000)
