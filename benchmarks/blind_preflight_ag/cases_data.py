"""Set ag, family data: what the loader delivers is not what the model should learn from (ids, truncation,
preprocessing, lengths, padding), with no error."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset
from transformers import DistilBertConfig, DistilBertForSequenceClassification

from benchmarks.blind_preflight_ag.cases_shapes import N_MELS, N_PHONES, TextCNN, phone_utterances
from benchmarks.blind_preflight_ag.cases_targets import DictDataset
from benchmarks.blind_preflight_ag.cases_trained import polarity_reviews
from benchmarks.blind_preflight_ag.registry import (
    acc_of,
    build_vocab,
    case,
    choice,
    ctc_greedy,
    encode,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    pad_to,
    seed,
    words,
)

# ---------------------------------------------------------------------------------------------- vocabulary per split

class BagOfEmbeddings(nn.Module):
    def __init__(self, vocab: int, d: int = 32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, ids):
        mask = (ids != 0).unsqueeze(-1).to(self.emb.weight.dtype)
        return self.mlp((self.emb(ids) * mask).sum(1) / mask.sum(1).clamp_min(1.0))


@case("ag_val_vocab_rebuilt_on_val_split", "data",
      "A review classifier's preprocessing function builds the word-to-id vocabulary from whatever texts it is given "
      "and is called once for the training split and once for the validation split: the validation texts are encoded "
      "with their own vocabulary (ids by that split's word frequencies), so the same word has different ids in the "
      "two loaders and validation accuracy stays at chance while the training loss falls (fix: build the vocabulary "
      "on the training texts once and encode every split with it).",
      r"vocab\w*.{0,120}(rebuilt|re-?built|built (again|separately|per split|on (the )?(val\w*|test))|fit\w* on "
      r"(the )?(val\w*|test)|per split|each split)|(different|inconsistent|mismatch\w*|not the same) .{0,40}"
      r"(ids?|indices|vocab\w*|token (ids?|indices)|mapping)|same (word|token).{0,60}different (ids?|indices)"
      r"|(val\w*|test|eval\w*).{0,80}(own|separate|its own|another|a different) (vocab\w*|tokeni[sz]er)")
def ag_val_vocab_rebuilt_on_val_split(fixed: bool = False):
    seed(0)
    texts, y = polarity_reviews(2000, 161)
    train_vocab = build_vocab(texts[:1600])
    val_vocab = train_vocab if fixed else build_vocab(texts[1600:])
    train_ids = pad_to([encode(t, train_vocab) for t in texts[:1600]], 12)
    val_ids = pad_to([encode(t, val_vocab) for t in texts[1600:]], 12)
    model = BagOfEmbeddings(len(train_vocab))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(train_ids, y[:1600]), 32),
                val_loader=loader(TensorDataset(val_ids, y[1600:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("ag_val_vocab_rebuilt_on_val_split", fixed_of(ag_val_vocab_rebuilt_on_val_split),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=120)


# ---------------------------------------------------------------------------------------------- pair truncation

def claim_pairs(n: int, s: int):
    """Fact-check pairs: an evidence passage of 18..30 ids holding one stance word (support 3 / refute 4) among content
    ids, and a 3-id claim holding one polarity word (positive 5 / negative 6); label: the evidence supports the
    claim (a supporting passage and a positive claim)."""
    g = gen(s)
    ev, cl, y = [], [], []
    for _ in range(n):
        k = int(torch.randint(18, 31, (1,), generator=g))
        passage = torch.randint(20, 70, (k,), generator=g).tolist()
        stance = int(torch.randint(0, 2, (1,), generator=g))
        polarity = int(torch.randint(0, 2, (1,), generator=g))
        passage[int(torch.randint(0, k, (1,), generator=g))] = 3 + stance
        claim = torch.randint(7, 20, (3,), generator=g).tolist()
        claim[int(torch.randint(0, 3, (1,), generator=g))] = 5 + polarity
        ev.append(passage)
        cl.append(claim)
        y.append(int(stance == 0 and polarity == 0))
    return ev, cl, torch.tensor(y)


def encode_pairs(ev, cl, max_len: int = 24, keep_claim: bool = True):
    """[CLS]=1 evidence [SEP]=2 claim [SEP], truncated to max_len."""
    rows = []
    for a, b in zip(ev, cl):
        if keep_claim:
            a = a[: max_len - len(b) - 3]                          # cut the evidence, keep the claim
        rows.append(([1] + a + [2] + b + [2])[:max_len])           # broken: cut the tail of the whole pair
    ids = pad_to(rows, max_len)
    return dict(input_ids=ids, attention_mask=(ids != 0).long())


@case("ag_pair_truncation_cuts_the_claim", "data",
      "A DistilBERT claim-verification model encodes [CLS] evidence [SEP] claim [SEP] and then truncates the joined "
      "ids with ids[:max_len] (24): the evidence passages are 18 to 30 tokens, so for most pairs the claim, which "
      "comes last, is cut off partly or entirely and whether the evidence supports it cannot be inferred from what is "
      "left (fix: truncate the "
      "evidence only, e.g. truncation='only_first' / longest_first, so the claim is always kept).",
      r"truncat\w*.{0,140}(second|claim|hypothesis|pair|text_pair|segment|sentence b|tail|end)"
      r"|(second|claim|hypothesis|text_pair|segment b).{0,100}(cut|truncat\w*|dropped|lost|missing|removed)"
      r"|only_first|longest_first|(max_len|max_length).{0,80}(cuts?|drops?|removes?|loses?)")
def ag_pair_truncation_cuts_the_claim(fixed: bool = False):
    seed(0)
    ev, cl, y = claim_pairs(1500, 171)
    feats = encode_pairs(ev, cl, keep_claim=fixed)
    config = DistilBertConfig(vocab_size=72, dim=48, n_layers=2, n_heads=4, hidden_dim=96, max_position_embeddings=32,
                              dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0, num_labels=2)
    model = DistilBertForSequenceClassification(config)
    train = {k: v[:1200] for k, v in feats.items()} | dict(labels=y[:1200])
    val = {k: v[1200:] for k, v in feats.items()} | dict(labels=y[1200:])
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(DictDataset(**train), 32),
                val_loader=loader(DictDataset(**val), 100, shuffle=False),
                loss_fn=None, max_steps=400)


fix("ag_pair_truncation_cuts_the_claim", fixed_of(ag_pair_truncation_cuts_the_claim),
    acc_of(lambda m, b: (m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1),
                         b["labels"])), "val accuracy", steps=150)


# ---------------------------------------------------------------------------------------------- stop-word removal

STOPWORDS = {"i", "me", "my", "we", "the", "a", "an", "and", "but", "if", "or", "as", "of", "at", "by", "for", "with",
             "this", "that", "is", "was", "it", "to", "no", "nor", "not", "only", "own", "same", "so", "than", "too",
             "very", "don't", "can't", "won't"}                      # the English list every tutorial copies
FUNCTION = ["the", "a", "is", "was", "it", "this", "and", "very", "i", "my"]


def negated_reviews(n: int, s: int):
    """Reviews mixing content and function words; 'not' right before the polar word flips its meaning."""
    g = gen(s)
    content = words("w", 40)
    texts, labels = [], []
    for _ in range(n):
        k = int(torch.randint(8, 15, (1,), generator=g))
        toks = [choice(g, FUNCTION) if torch.rand(1, generator=g) < 0.4 else choice(g, content) for _ in range(k)]
        polar = choice(g, ["good", "great", "bad", "awful"])
        pos = int(torch.randint(1, k, (1,), generator=g))
        negated = bool(torch.rand(1, generator=g) < 0.5)
        toks[pos] = polar
        if negated:
            toks[pos - 1] = choice(g, ["not", "not", "not", "no", "never"])
        texts.append(" ".join(toks))
        labels.append(int((polar in ("good", "great")) != negated))
    return texts, torch.tensor(labels)


def clean(text: str, keep_negations: bool) -> str:
    stop = STOPWORDS - {"no", "nor", "not", "never", "don't", "can't", "won't"} if keep_negations else STOPWORDS
    return " ".join(w for w in text.split() if w not in stop)


@case("ag_stopword_list_strips_negation", "data",
      "A sentiment pipeline removes English stop words before tokenising, with the standard NLTK-style list, which "
      "contains 'not', 'no' and 'nor' ('never' is not in it): 'not good' becomes 'good', so most of the negations "
      "that flip half of the labels are deleted from the inputs and the labels of negated reviews look like noise (fix: drop the negations from the stop-word list, or skip "
      "stop-word removal for sentiment).",
      r"stop-?\s?words?|negation\w*.{0,80}(removed|stripped|deleted|dropped|lost|filtered)"
      r"|(removed|stripped|deleted|dropped|filtered)\w*.{0,60}negation|['\"]not['\"].{0,60}(removed|stripped|deleted|"
      r"filtered|list)")
def ag_stopword_list_strips_negation(fixed: bool = False):
    seed(0)
    texts, y = negated_reviews(2000, 181)
    texts = [clean(t, keep_negations=fixed) for t in texts]
    vocab = build_vocab(texts[:1600])
    ids = pad_to([encode(t, vocab) for t in texts], 16)
    model = TextCNN(len(vocab), 16, channels_first=True)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(ids[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("ag_stopword_list_strips_negation", fixed_of(ag_stopword_list_strips_negation),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=150)


# ---------------------------------------------------------------------------------------------- CTC output lengths

class StridedAcousticModel(nn.Module):
    """A Conv1d front end with stride 2 (halves the frame rate), then a BiGRU and per-frame phone logits."""

    def __init__(self, n_out: int = N_PHONES + 1, hidden: int = 32):
        super().__init__()
        self.conv = nn.Conv1d(N_MELS, hidden, kernel_size=3, stride=2, padding=1)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, n_out)

    def forward(self, x):                                            # x: (B, T, mels) -> (B, ceil(T / 2), classes)
        h = torch.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        return self.out(self.rnn(h)[0])


def strided_ctc_case(fixed: bool):
    seed(0)
    x, xl, y, yl = phone_utterances(1300, 191)
    ctc = nn.CTCLoss(blank=0, zero_infinity=True)

    def loss(model, batch):
        feats, feat_lens, phones, phone_lens = batch
        log_probs = model(feats).log_softmax(-1).transpose(0, 1)
        out_lens = (feat_lens + 1) // 2 if fixed else feat_lens // 4   # broken: a 4x-subsampling recipe's formula
        return ctc(log_probs, phones + 1, out_lens, phone_lens)

    model = StridedAcousticModel()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1000], xl[:1000], y[:1000], yl[:1000]), 32),
                val_loader=loader(TensorDataset(x[1000:], xl[1000:], y[1000:], yl[1000:]), 100, shuffle=False),
                loss_fn=loss, max_steps=400)


def strided_exact_match(model, kw):
    """Greedy CTC decoding over each utterance's real output frames, ceil(T / 2), against its phones."""
    def fn(m, b):
        x, xl, y, yl = b
        hyp = ctc_greedy(m(x), (xl + 1) // 2, 0)
        return sum(h == (y[i, : int(yl[i])] + 1).tolist() for i, h in enumerate(hyp)), len(hyp)
    return mean_over(model, kw["val_loader"], fn)


@case("ag_ctc_lengths_wrong_subsampling", "data",
      "A CTC phone recogniser whose Conv1d front end has stride 2 (output frames = ceil(T / 2)) passes "
      "input_lengths = feat_lens // 4, copied from a 4x-subsampling recipe, to nn.CTCLoss(zero_infinity=True): the "
      "lengths are half the real ones, many utterances become impossible to align and zero_infinity silently turns "
      "their loss into 0, and the rest are aligned into the first half of their frames only, so decoding the real "
      "frames emits junk (fix: input_lengths = (feat_lens + 1) // 2, the conv's own output-length formula).",
      r"(input|output|frame|ctc)[_ ]?lengths?.{0,140}(subsampl\w*|downsampl\w*|stride|// ?4|too short|half|wrong|"
      r"do not match|don't match|mismatch)|zero_infinity|(subsampl\w*|downsampl\w*|stride).{0,100}(lengths?)"
      r"|(infinite|inf) (ctc )?loss(es)?.{0,60}(zeroed|zero|hidden|masked)|impossible to align|cannot be aligned")
def ag_ctc_lengths_wrong_subsampling(fixed: bool = False):
    return strided_ctc_case(fixed)


fix("ag_ctc_lengths_wrong_subsampling", fixed_of(ag_ctc_lengths_wrong_subsampling), strided_exact_match,
    "val utterance exact match (greedy CTC)", steps=150)


# ---------------------------------------------------------------------------------------------- post-padding

class LastStepLSTM(nn.Module):
    def __init__(self, vocab: int, d: int = 32, use_lengths: bool = True):
        super().__init__()
        self.use_lengths = use_lengths
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.lstm = nn.LSTM(d, d, batch_first=True)
        self.fc = nn.Linear(d, 2)

    def forward(self, ids):
        out = self.lstm(self.emb(ids))[0]                           # (B, T, H)
        if self.use_lengths:
            last = (ids != 0).sum(1) - 1                             # the last real word of each right-padded review
            return self.fc(out[torch.arange(ids.shape[0], device=ids.device), last])
        return self.fc(out[:, -1])                                   # Keras habit: the last time step


@case("ag_post_padding_last_time_step", "data",
      "A review LSTM right-pads every batch to 64 tokens (pad_sequence / padding='post') although reviews are 5 to 12 "
      "words, and classifies from output[:, -1], the state after 50-odd padding steps (Keras pads 'pre' by default, "
      "which is why the habit works there): the sentiment word's trace is washed out by the padding before the read-out "
      "(fix: take the output at lengths - 1, or pack_padded_sequence and use h_n).",
      r"(output|out|hidden|state)\s*\[\s*:\s*,\s*-1\s*\]|last (time ?step|position|output).{0,100}(pad\w*)"
      r"|pad\w*.{0,100}last (time ?step|position|output|state)|post[- ]?pad\w*|padding\s*=\s*['\"]post"
      r"|pack_padded_sequence|lengths\s*-\s*1")
def ag_post_padding_last_time_step(fixed: bool = False):
    seed(0)
    texts, y = polarity_reviews(1800, 201, length=12, min_length=5)
    vocab = build_vocab(texts[:1400])
    ids = pad_to([encode(t, vocab) for t in texts], 64)
    model = LastStepLSTM(len(vocab), use_lengths=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids[:1400], y[:1400]), 32),
                val_loader=loader(TensorDataset(ids[1400:], y[1400:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("ag_post_padding_last_time_step", fixed_of(ag_post_padding_last_time_step),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=200)
