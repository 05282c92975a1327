"""Set ag, family targets: the model is trained towards the wrong answer (unshifted, misaligned, ignored or colliding
labels), with no error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset
from transformers import BertConfig, BertForTokenClassification

from benchmarks.blind_preflight_ag.cases_shapes import N_MELS, AcousticModel, BiLSTMTagger, tagged_sentences
from benchmarks.blind_preflight_ag.registry import (
    TinyCausalLM,
    case,
    ctc_greedy,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    next_token_acc,
    seed,
    token_sequences,
)


class DictDataset(torch.utils.data.Dataset):
    """Rows of a dict of equal-length tensors, collated back into a dict (the Hugging Face batch layout)."""

    def __init__(self, **tensors):
        self.tensors = tensors
        self.n = len(next(iter(tensors.values())))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.tensors.items()}


# ---------------------------------------------------------------------------------------------- causal LM

@case("ag_lm_targets_not_shifted", "targets",
      "A minGPT-style causal Transformer LM computes cross_entropy(logits.view(-1, V), input_ids.view(-1)) with the "
      "logits at position t scored against the token at t itself: under the causal mask token t is already in the "
      "input, so the model learns to copy its current input and the loss falls towards 0 while next-token prediction "
      "never improves (fix: logits[:, :-1] against input_ids[:, 1:]).",
      r"(labels?|targets?).{0,80}(not|never|un)[- ]?shift\w*|(not|never|un|forgot to|without)[- ]?(shift\w*).{0,60}"
      r"(labels?|targets?|by one)"
      r"|(logits\[\s*:?\s*,?\s*:\s*-1\]|\[\s*:\s*,\s*:-1\s*\]|input_ids\[\s*:\s*,\s*1:\s*\]|\[\s*:\s*,\s*1:\s*\])"
      r"|(predict\w*|scor\w*|learn\w*) (the |its )?(current|same|own|input) (token|position|input)"
      r"|cop(y|ies|ying) (the |its )?(current|own) (input|token)|(identity|copy)[- ]task")
def ag_lm_targets_not_shifted(fixed: bool = False):
    seed(0)
    ids = token_sequences(2400, 16, 40, s=11)

    def lm_loss(model, batch):
        tokens = batch[0]
        logits = model(tokens)
        if fixed:
            return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))

    model = TinyCausalLM(40, d=48)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01),
                train_loader=loader(TensorDataset(ids[:2000]), 32),
                val_loader=loader(TensorDataset(ids[2000:]), 100, shuffle=False),
                loss_fn=lm_loss, max_steps=800)


fix("ag_lm_targets_not_shifted", fixed_of(ag_lm_targets_not_shifted), next_token_acc, "val next-token accuracy",
    steps=120)


# ---------------------------------------------------------------------------------------------- BERT NER, subwords

N_WORDS, N_NER = 60, 5
PAD, CLS, SEP, UNK = 0, 1, 2, 3
FIRST = 4                      # first pieces: FIRST + word
CONT = FIRST + N_WORDS         # continuation pieces ("##x"): CONT + k, k < 8
WORD_TAG = torch.randint(0, N_NER, (N_WORDS,), generator=gen(31))
WORD_TAG[: N_WORDS // 2] = 0   # half the words are O
SPLIT = torch.rand(N_WORDS, generator=gen(32)) < 0.5


def word_pieces(w: int) -> list[int]:
    """The sub-word pieces a WordPiece-style tokenizer gives word w: one piece, or a stem and a '##' suffix."""
    return [FIRST + w, CONT + w % 8] if SPLIT[w] else [FIRST + w]


def ner_features(n: int, s: int, max_len: int = 26, cls_offset: int = 1):
    """input_ids [CLS] pieces [SEP] pad, attention_mask, and labels on the first piece of each word (-100 elsewhere),
    written at piece index + cls_offset (1 is right: [CLS] sits at position 0)."""
    g = gen(s)
    ids = torch.zeros(n, max_len, dtype=torch.long)
    labels = torch.full((n, max_len), -100, dtype=torch.long)
    for i in range(n):
        k = int(torch.randint(5, 11, (1,), generator=g))
        sent = torch.randint(0, N_WORDS, (k,), generator=g).tolist()
        pieces, starts = [], []
        for w in sent:
            starts.append(len(pieces))
            pieces += word_pieces(w)
        row = [CLS] + pieces + [SEP]
        ids[i, : len(row)] = torch.tensor(row)
        for w, st in zip(sent, starts):
            labels[i, st + cls_offset] = WORD_TAG[w]
    return dict(input_ids=ids, attention_mask=(ids != PAD).long(), labels=labels)


def bert_config(**kw):
    base = dict(vocab_size=CONT + 8, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=96, max_position_embeddings=32, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0)
    base.update(kw)
    return BertConfig(**base)


@torch.no_grad()
def word_tag_accuracy(model, kw):
    """Tag accuracy on the first piece of every validation word, scored against the word's true tag (read from the
    input ids, so it does not depend on how the labels were aligned)."""
    def fn(m, b):
        ids = b["input_ids"]
        pred = m(input_ids=ids, attention_mask=b["attention_mask"]).logits.argmax(-1)
        first = (ids >= FIRST) & (ids < CONT)
        truth = WORD_TAG.to(ids.device)[(ids - FIRST).clamp(0, N_WORDS - 1)]
        return (pred[first] == truth[first]).sum().item(), first.sum().item()
    return mean_over(model, kw["val_loader"], fn)


def bert_ner_case(fixed: bool):
    seed(0)
    train = ner_features(1200, 33, cls_offset=1 if fixed else 0)
    val = ner_features(300, 34, cls_offset=1 if fixed else 0)
    model = BertForTokenClassification(bert_config(num_labels=N_NER))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(DictDataset(**train), 32),
                val_loader=loader(DictDataset(**val), 100, shuffle=False),
                loss_fn=None, max_steps=300)


@case("ag_ner_labels_miss_cls_offset", "targets",
      "The word-to-subword label alignment for a BERT token classifier writes each word's tag at the index of its "
      "first piece in the piece list, but input_ids start with [CLS], so every label lands one position to the left "
      "(on [CLS] or the previous word's last piece): the model is trained to predict the next word's tag and the "
      "loss falls while the tags it outputs are shifted (fix: offset the label index by 1 for [CLS], or align with "
      "word_ids()).",
      r"\[?cls\]?.{0,120}(offset|shift\w*|misalign\w*|one (position|token|place) (to the )?(left|off|early))"
      r"|(offset|shift\w*|misalign\w*|off[- ]by[- ]one).{0,120}(\[cls\]|cls token|special tokens?|sub-?word|word_ids|"
      r"first piece)"
      r"|labels?.{0,60}(one|1) (position|token|place|step) (to the left|early|off)"
      r"|word_ids\(\)")
def ag_ner_labels_miss_cls_offset(fixed: bool = False):
    return bert_ner_case(fixed)


fix("ag_ner_labels_miss_cls_offset", fixed_of(ag_ner_labels_miss_cls_offset), word_tag_accuracy,
    "val word tag accuracy", steps=100)


# ---------------------------------------------------------------------------------------------- STS bi-encoder

def sts_pairs(n: int, s: int, n_words: int = 90, k: int = 6):
    """Sentence pairs of k content words; the second shares j of the first's words (j = 0..k); the annotators'
    similarity is 5 * j / k plus noise, on the STS 0..5 scale."""
    g = gen(s)
    a = torch.zeros(n, k, dtype=torch.long)
    b = torch.zeros(n, k, dtype=torch.long)
    score = torch.zeros(n)
    for i in range(n):
        perm = torch.randperm(n_words, generator=g) + 1
        j = int(torch.randint(0, k + 1, (1,), generator=g))
        a[i] = perm[:k]
        b[i] = torch.cat([perm[:j], perm[k: 2 * k - j]])[torch.randperm(k, generator=g)]
        score[i] = (5.0 * j / k + 0.3 * torch.randn(1, generator=g)).clamp(0, 5)
    return a, b, score


class MeanPoolEncoder(nn.Module):
    """A sentence-transformers-style bi-encoder: token embeddings, a position-wise MLP, mean pooling."""

    def __init__(self, vocab: int = 91, d: int = 48):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.ff = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, d))

    def encode(self, ids):
        return self.ff(self.emb(ids)).mean(dim=1)

    def forward(self, pair):
        a, b = pair
        return F.cosine_similarity(self.encode(a), self.encode(b), dim=-1)


@torch.no_grad()
def sts_rmse(model, kw):
    """RMSE of the model's similarity prediction against the gold score, both on the STS 0..5 scale: the prediction is
    the cosine times the factor the labels were divided by (5 for the fixed case, 1 for the raw scores)."""
    was = model.training
    model.eval()
    cos, gold = [], []
    for a, b, score in kw["val_loader"]:
        cos.append(model((a, b)).float().cpu())
        gold.append(score.float().cpu())
    model.train(was)
    cos, gold = torch.cat(cos), torch.cat(gold)
    scale = 5.0 if float(gold.max()) <= 1.0 else 1.0
    return float(((cos - gold) * scale).pow(2).mean().sqrt())


@case("ag_sts_scores_not_scaled_to_cosine", "targets",
      "A bi-encoder for semantic textual similarity regresses the cosine similarity of two mean-pooled sentence "
      "embeddings onto the raw STS gold scores (0 to 5) with MSELoss: cosine cannot exceed 1, so every pair scored "
      "above 1 is pushed to the same ceiling and the ordering between 'related' and 'near paraphrase' is never "
      "learnt (fix: divide the scores by 5 to map them into the cosine range, as the sentence-transformers STS example "
      "does).",
      r"(scores?|labels?|targets?).{0,100}(0\s*(-|to|\.\.|–)\s*5|range|scale|normali[sz]\w*|divid\w* by 5|/ ?5\b)"
      r".{0,100}(cos\w*|\[?-?1\s*,\s*1\]?|0\s*(-|to|\.\.)\s*1)"
      r"|(cos\w*).{0,100}(cannot|can't|never|bounded|at most|only reach|range).{0,80}(targets?|labels?|scores?|1\b)"
      r"|(targets?|labels?|scores?).{0,60}(outside|beyond|above|exceed\w*) (the )?(output|cosine|prediction|reachable)"
      r" ?(range)?|unreachable (targets?|labels?)|divide (the )?(scores?|labels?) by 5")
def ag_sts_scores_not_scaled_to_cosine(fixed: bool = False):
    seed(0)
    a, b, score = sts_pairs(1800, 43)
    target = score / 5.0 if fixed else score

    def pair_loss(model, batch):                       # CosineSimilarityLoss: MSE between cosine and gold score
        sa, sb, gold = batch
        return F.mse_loss(model((sa, sb)), gold)

    model = MeanPoolEncoder()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(a[:1400], b[:1400], target[:1400]), 32),
                val_loader=loader(TensorDataset(a[1400:], b[1400:], target[1400:]), 200, shuffle=False),
                loss_fn=pair_loss, max_steps=500)


fix("ag_sts_scores_not_scaled_to_cosine", fixed_of(ag_sts_scores_not_scaled_to_cosine), sts_rmse,
    "val RMSE of the predicted similarity (0-5 scale)", steps=100, higher=False)


# ---------------------------------------------------------------------------------------------- NER ignore_index

@case("ag_ner_ignore_index_is_o_tag", "targets",
      "A BiLSTM NER tagger pads its label sequences with 0 and builds nn.CrossEntropyLoss(ignore_index=0) to skip "
      "the padding, but tag2id maps 'O' to 0 too: every O token (61% of the tokens) is dropped from the loss, so the "
      "model never learns O and tags ordinary words as entities (fix: pad labels with -100 and keep the default "
      "ignore_index, or give padding its own id).",
      r"ignore_index\s*=?\s*0|ignore_index.{0,120}(\bO\b|'o'|outside|real (class|tag|label)|valid (class|tag|label)"
      r"|class 0|tag 0|label 0)|(\bO\b|'o'|outside) (tag|label|class).{0,80}(ignored|dropped|never (learn|train)\w*)"
      r"|(class|tag|label) 0.{0,60}(ignored|never|excluded|dropped)")
def ag_ner_ignore_index_is_o_tag(fixed: bool = False):
    seed(0)
    ids, tags = tagged_sentences(1500, 8)
    tags = tags.masked_fill(tags == -100, -100 if fixed else 0)         # the broken script pads labels with 0
    model = BiLSTMTagger(91)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids[:1200], tags[:1200]), 32),
                val_loader=loader(TensorDataset(ids[1200:], tags[1200:]), 100, shuffle=False),
                loss_fn=TagCE(ignore_index=-100 if fixed else 0), max_steps=500)


class TagCE(nn.CrossEntropyLoss):
    """CrossEntropyLoss over (B, T, C) tagger logits."""

    def forward(self, logits, target):
        return super().forward(logits.transpose(1, 2), target)


def real_token_accuracy(model, kw):
    def fn(m, b):
        ids, tags = b
        pred = m(ids).argmax(-1)
        real = ids != 0
        return (pred[real] == tags[real]).sum().item(), real.sum().item()
    return mean_over(model, kw["val_loader"], fn)


fix("ag_ner_ignore_index_is_o_tag", fixed_of(ag_ner_ignore_index_is_o_tag), real_token_accuracy,
    "val token accuracy (real tokens)", steps=120)


# ---------------------------------------------------------------------------------------------- CTC handwriting

ALPHABET = sorted(set("a bad cab dab fed ace bead face"))      # [' ', 'a', 'b', 'c', 'd', 'e', 'f']
LEXICON = ["bad", "cab", "dab", "fed", "ace", "bead", "face", "be", "fade", "deaf"]


def stroke_lines(n: int, s: int, t_max: int = 30):
    """Pen-stroke frames of short handwritten lines (two words); every character, the space included, is 2-3 frames
    of its own prototype. Returns frames, frame counts, character ids (index in ALPHABET) and line lengths."""
    g = gen(s)
    protos = torch.randn(len(ALPHABET), N_MELS, generator=gen(515)) * 1.5
    feats = torch.zeros(n, t_max, N_MELS)
    flens, tgts, tlens = [], torch.zeros(n, 9, dtype=torch.long), []
    for i in range(n):
        line = " ".join(LEXICON[j] for j in torch.randint(0, len(LEXICON), (2,), generator=g).tolist())
        chars = [ALPHABET.index(c) for c in line]
        t = 0
        for c in chars:
            for _ in range(int(torch.randint(2, 4, (1,), generator=g))):
                if t < t_max:
                    feats[i, t] = protos[c]
                t += 1
        t = min(t, t_max)
        feats[i, :t] += 0.5 * torch.randn(t, N_MELS, generator=g)
        flens.append(t)
        tgts[i, : len(chars)] = torch.tensor(chars)
        tlens.append(len(chars))
    return feats, torch.tensor(flens), tgts, torch.tensor(tlens)


@case("ag_ctc_blank_is_a_character", "targets",
      "A CTC handwriting recogniser maps characters with {c: i for i, c in enumerate(sorted(set(text)))}, which gives "
      "the space character id 0, and uses nn.CTCLoss(blank=0) with len(alphabet) + 1 outputs: the space is the blank, "
      "so the word gaps in the targets are read as blanks and the model can never emit a space (greedy decoding "
      "glues the words together); output class len(alphabet) is never a target (fix: character ids from 1, "
      "i + 1, keeping 0 for the blank).",
      r"blank.{0,120}(collid\w*|same (id|index)|shares?|clash\w*|overlap\w*|also (a|the|used)|is (a|the) (real )?"
      r"(character|char|label|token|space))|(character|char|label|space|token).{0,80}(id|index) 0.{0,80}blank"
      r"|(blank|index 0|id 0).{0,80}(reserved|must not|cannot|can't) .{0,40}(label|character|target)"
      r"|enumerate\(.{0,60}(start\s*=\s*1)|i\s*\+\s*1.{0,40}blank")
def ag_ctc_blank_is_a_character(fixed: bool = False):
    seed(0)
    x, xl, y, yl = stroke_lines(1200, 51)
    char_ids = y + 1 if fixed else y                                     # broken: ' ' -> 0 == blank

    def ctc(model, batch):
        feats, feat_lens, chars, char_lens = batch
        log_probs = model(feats).log_softmax(-1).transpose(0, 1)
        return F.ctc_loss(log_probs, chars, feat_lens, char_lens, blank=0)

    model = AcousticModel(len(ALPHABET) + 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1000], xl[:1000], char_ids[:1000], yl[:1000]), 32),
                val_loader=loader(TensorDataset(x[1000:], xl[1000:], char_ids[1000:], yl[1000:]), 100,
                                  shuffle=False),
                loss_fn=ctc, max_steps=400)


def line_exact_match(model, kw):
    """Greedy-decoded line equals the written line (as text: each run of the model's ids mapped back through the
    case's own id -> character table)."""
    def fn(m, b):
        x, xl, chars, cl = b
        shift = int(chars.max() >= len(ALPHABET))          # the fixed case's ids run 1..7
        hyp = ctc_greedy(m(x), xl, 0)
        ok = 0
        for i, h in enumerate(hyp):
            ref = "".join(ALPHABET[c - shift] for c in chars[i, : int(cl[i])].tolist())
            out = "".join(ALPHABET[c - shift] if 0 <= c - shift < len(ALPHABET) else "?" for c in h)
            ok += out == ref
        return ok, len(hyp)
    return mean_over(model, kw["val_loader"], fn)


fix("ag_ctc_blank_is_a_character", fixed_of(ag_ctc_blank_is_a_character), line_exact_match,
    "val line exact match (greedy CTC)", steps=120)
