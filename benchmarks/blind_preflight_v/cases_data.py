"""Data: five pipelines that hand the model something other than what the task is (leaks, masks, scalers, labels)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset
from transformers import BertConfig, BertForTokenClassification, GPT2Config, GPT2LMHeadModel

from benchmarks.blind_preflight_v.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed


# --------------------------------------------------------------------------- D1: window z-scored with its target
def _sensor_slices(n, g, window=24):
    t = torch.arange(window + 1, dtype=torch.float32)
    f = 0.04 + 0.08 * torch.rand(n, 1, generator=g)
    s = (1 + torch.rand(n, 1, generator=g)) * torch.sin(6.283 * f * t + 6.283 * torch.rand(n, 1, generator=g))
    return s + 3 * torch.randn(n, 1, generator=g) + 0.05 * torch.randn(n, window + 1, generator=g)


def _windows(slices, leak):
    x, y = slices[:, :-1], slices[:, -1]
    ref = slices if leak else x                          # leak: statistics of the whole slice, target included
    mu, sd = ref.mean(1, keepdim=True), ref.std(1, keepdim=True)
    return (x - mu) / sd, (y - mu.squeeze(1)) / sd.squeeze(1)


@case("window_zscore_includes_target", "data",
      bug="Each training window is z-scored with the mean and std of the whole 25-step slice, target included, so "
          "the target is recoverable from the 24 normalised inputs (the slice sums to zero) and the model learns that "
          "leak instead of the signal; at inference the statistics can only come from the inputs.",
      cause_pattern=r"(target|label|\by\b)\w*.{0,60}(included|inside|part of|in) .{0,30}(window|slice|normali[sz]ation|"
                    r"statistics|mean)|normali[sz]\w*.{0,80}(includ\w*|with) .{0,20}(the )?(target|label|future)"
                    r"|leak\w*.{0,60}(target|label|future|normali[sz])|look[- ]?ahead|(statistics|mean|std).{0,60}"
                    r"(future|target)")
def window_leak(fixed: bool = False):
    seed(0)
    slices = _sensor_slices(1900, gen(41))
    xt, yt = _windows(slices[:1500], leak=not fixed)
    xv, yv = _windows(slices[1500:], leak=False)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 32),
                val_loader=loader(TensorDataset(xv, yv), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("window_zscore_includes_target", fixed_of(window_leak), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE (inputs' statistics)", higher=False)


# --------------------------------------------------------------------------- D2: HF mask used as key_padding_mask
class ClipTransformer(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.inp = nn.Linear(8, 32)
        self.cls = nn.Parameter(torch.randn(1, 1, 32) * 0.02)
        self.pos = nn.Parameter(torch.randn(25, 32) * 0.02)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 4)

    def forward(self, frames, attention_mask):          # attention_mask: 1 = real frame, 0 = padding (HF style)
        h = torch.cat([self.cls.expand(frames.size(0), -1, -1), self.inp(frames)], 1) + self.pos
        mask = torch.cat([torch.ones_like(attention_mask[:, :1]), attention_mask], 1)
        pad = mask == 0 if self.fixed else mask.bool()
        return self.head(self.enc(h, src_key_padding_mask=pad)[:, 0])


def _clips(n, g, protos):
    y = torch.randint(0, 4, (n,), generator=g)
    length = torch.randint(6, 21, (n,), generator=g)
    mask = (torch.arange(24)[None] < length[:, None]).long()
    frames = (protos[y][:, None] + 1.0 * torch.randn(n, 24, 8, generator=g)) * mask[..., None]
    return frames, mask, y


def _clip_loss(model, batch):
    frames, mask, y = batch
    return F.cross_entropy(model(frames, mask), y)


@case("hf_mask_as_key_padding_mask", "data",
      bug="The collate returns a Hugging Face-style attention_mask (1 = real frame, 0 = padding) and it is passed "
          "straight to nn.TransformerEncoder as src_key_padding_mask, where True means 'ignore this key', so the "
          "[CLS] token attends only to the padding frames and never to the clip.",
      cause_pattern=r"src_key_padding_mask|key_padding_mask|(attention[_ ]mask|mask).{0,80}(invert\w*|revers\w*|flipped|"
                    r"opposite|negat\w*|logical_not|== ?0)|True (means|=|marks) .{0,30}(ignore|pad|masked)|attend\w* "
                    r"only to (the )?pad")
def mask_inverted(fixed: bool = False):
    seed(0)
    g = gen(42)
    protos = torch.randn(4, 8, generator=g)
    frames, mask, y = _clips(1500, g, protos)
    model = ClipTransformer(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(frames[:1200], mask[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(frames[1200:], mask[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=_clip_loss, max_steps=250)


fix("hf_mask_as_key_padding_mask", fixed_of(mask_inverted), acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])),
    "val accuracy", steps=250)


# --------------------------------------------------------------------------- D3: validation scaled with its own fit
class Scaler:
    """StandardScaler, the way the notebook wrote it."""

    def fit_transform(self, x):
        self.mean, self.std = x.mean(0), x.std(0)
        return self.transform(x)

    def transform(self, x):
        return (x - self.mean) / self.std


def _load_rows(temps, g):
    n = len(temps)
    hour = torch.randint(0, 24, (n,), generator=g).float()
    humid = 40 + 40 * torch.rand(n, generator=g)
    load = 60 + 3 * F.relu(15 - temps) + 4 * F.relu(temps - 22) + 8 * torch.sin(6.283 * hour / 24) \
        + 0.05 * humid + 2 * torch.randn(n, generator=g)
    x = torch.stack([temps, torch.sin(6.283 * hour / 24), torch.cos(6.283 * hour / 24), humid], 1)
    return x, load


@case("val_features_scaled_with_own_fit", "data",
      bug="The validation features (a heat-wave week) are standardised with a scaler fit on the validation set itself "
          "(fit_transform instead of the training scaler's transform), so their temperatures are shifted back to "
          "look like an average day and the model predicts ordinary loads for them.",
      cause_pattern=r"fit_transform|(scaler|normali[sz]\w*|standardi[sz]\w*|statistics|mean and std).{0,80}(fit\w*|"
                    r"computed|estimated) (on|from) (the )?(val\w*|test|eval\w*|held[- ]out)|(val\w*|test|eval\w*)"
                    r".{0,60}(own|separate|independent\w*) (scaler|statistics|normali[sz]\w*|mean)|train\w* (scaler|"
                    r"statistics|mean and std).{0,60}(val|test)|(normali[sz]\w*|standardi[sz]\w*|scaled) with (their|its) "
                    r"own (statistics|mean|scaler|fit)")
def val_own_scaler(fixed: bool = False):
    seed(0)
    g = gen(43)
    x_tr, y_tr = _load_rows(-5 + 40 * torch.rand(2000, generator=g), g)
    x_va, y_va = _load_rows(26 + 10 * torch.rand(300, generator=g), g)
    scaler = Scaler()
    x_tr = scaler.fit_transform(x_tr)
    x_va = scaler.transform(x_va) if fixed else Scaler().fit_transform(x_va)
    y_mu, y_sd = y_tr.mean(), y_tr.std()
    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x_tr, (y_tr - y_mu) / y_sd), 32),
                val_loader=loader(TensorDataset(x_va, (y_va - y_mu) / y_sd), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("val_features_scaled_with_own_fit", fixed_of(val_own_scaler), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE (standardised load)", higher=False)


# --------------------------------------------------------------------------- D4: NER word labels not aligned
def _pieces(word):
    n = 1 + (word % 3 == 0) + (word % 5 == 0)
    return [10 + word] + [210 + (word * 7 + k) % 20 for k in range(n - 1)]


def _tag(word):
    return 0 if word < 120 else 1 + (word - 120) // 27


class NerSentences(Dataset):
    def __init__(self, words, aligned):
        self.words, self.aligned = words.tolist(), aligned

    def __len__(self):
        return len(self.words)

    def __getitem__(self, i):
        ids, labels = [1], [-100]                       # [CLS]
        for w in self.words[i]:
            p = _pieces(w)
            ids += p
            labels += [_tag(w)] + [-100] * (len(p) - 1)
        if not self.aligned:                             # word tags, padded to the token length
            labels = [_tag(w) for w in self.words[i]]
            labels += [-100] * (len(ids) - len(labels))
        pad = 26 - len(ids)
        return {"input_ids": torch.tensor(ids + [0] * pad), "attention_mask": torch.tensor([1] * len(ids) + [0] * pad),
                "labels": torch.tensor(labels + [-100] * pad)}


def _tiny_bert_tagger():
    return BertForTokenClassification(BertConfig(vocab_size=240, hidden_size=32, num_hidden_layers=2,
                                                  num_attention_heads=2, intermediate_size=64,
                                                  max_position_embeddings=32, num_labels=4))


def ner_unaligned(fixed: bool = False):
    seed(0)
    words = torch.randint(0, 200, (1500, 8), generator=gen(44))
    model = _tiny_bert_tagger()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(NerSentences(words[:1200], aligned=fixed), 32),
                val_loader=loader(NerSentences(words[1200:], aligned=True), 100, shuffle=False),
                loss_fn=None, max_steps=200)


case("ner_word_tags_not_aligned_to_pieces", "data",
     bug="Word-level NER tags are padded to the wordpiece sequence length without aligning them (no word_ids mapping, "
         "no -100 on [CLS] and continuation pieces), so from the [CLS] token on, and further after every word split "
         "into several pieces, each tag sits on the wrong token.",
     cause_pattern=r"word_ids|align\w*.{0,60}(labels?|tags?|subwords?|word ?pieces?|tokens?)|(labels?|tags?).{0,80}"
                   r"(misalign\w*|shifted|offset|wrong tokens?|not aligned)|(sub-?words?|word ?pieces?).{0,80}(labels?|"
                   r"tags?)|first (sub-?)?(token|piece) of (each|every) word")(ner_unaligned)


def _ner_acc(m, b):
    logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    return logits.argmax(-1), b["labels"]


fix("ner_word_tags_not_aligned_to_pieces", fixed_of(ner_unaligned), acc_of(_ner_acc), "val tag accuracy (aligned)",
    steps=200)


# --------------------------------------------------------------------------- D5: pad = eos, EOS labels masked
EOS = 1


def _progressions(n, g, length=16):
    ids = torch.full((n, length), EOS)
    mask = torch.zeros(n, length, dtype=torch.long)
    for i in range(n):
        v = int(torch.randint(3, 20, (1,), generator=g))
        step = int(torch.randint(2, 5, (1,), generator=g))
        seq = []
        while v < 45:
            seq.append(v)
            v += step
        seq = seq[:length - 1] + [EOS]                    # the tokenizer appends eos; padding uses the same id
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
    return ids, mask


class Progressions(Dataset):
    def __init__(self, ids, mask, fixed):
        self.ids, self.mask, self.fixed = ids, mask, fixed

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids, mask = self.ids[i], self.mask[i]
        labels = ids.clone()
        if self.fixed:
            labels[mask == 0] = -100
        else:
            labels[labels == EOS] = -100                  # labels[labels == tokenizer.pad_token_id] = -100
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _eos_rate(m, b):
    ids, mask = b["input_ids"], b["attention_mask"]
    last = mask.sum(1) - 2                                # the last content token, just before the eos
    logits = m(input_ids=ids, attention_mask=mask).logits
    pred = logits[torch.arange(len(ids), device=ids.device), last].argmax(-1)
    return pred, torch.full_like(pred, EOS)


@case("pad_is_eos_labels_mask_eos", "data",
      bug="pad_token is set to the eos token and the collate masks labels with labels[labels == pad_token_id] = -100, "
          "which also masks every real EOS, so the GPT-2 model is never trained to emit EOS and never learns when a "
          "sequence ends.",
      cause_pattern=r"\beos\b|end[- ]of[- ](sequence|text)|pad_token(_id)?.{0,40}(eos|same id)|(never|not) "
                    r"(learns?|trained) (to )?(stop|emit|generate|predict|end)|stop token")
def eos_masked(fixed: bool = False):
    seed(0)
    ids, mask = _progressions(1500, gen(45))
    model = GPT2LMHeadModel(GPT2Config(vocab_size=48, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(Progressions(ids[:1200], mask[:1200], fixed), 32),
                val_loader=loader(Progressions(ids[1200:], mask[1200:], True), 100, shuffle=False),
                loss_fn=None, max_steps=200)


fix("pad_is_eos_labels_mask_eos", fixed_of(eos_masked), acc_of(_eos_rate), "val rate of eos after the last value",
    steps=200)
