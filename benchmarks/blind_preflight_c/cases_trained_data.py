"""Set b, broken: what is trained, data by content, accumulation / optimizer mechanics."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, SubsetRandomSampler, TensorDataset, random_split

from benchmarks.blind_preflight_c.registry import case, loader, seed, teacher_classes, token_sequences

UNREGISTERED = (r"nn\.Parameter|register_(parameter|buffer)|ParameterList|ModuleList|python list|plain list|"
                r"not (a |an )?(registered|module parameter|parameter)|plain (tensor|attribute)|tensor attribute|"
                r"unregistered|outside (the )?(model|module)'?s? parameters|"
                r"not (in|among|part of) (the )?(model|module)'?s? parameters")
NOT_IN_OPT = (r"(not|never|missing|absent)[^.]*optimi[sz]er|optimi[sz]er[^.]*(miss|lack|omit|not (updat|includ|"
              r"contain|hold)|does(n't| not) (updat|includ|contain|hold))")
DROPOUT = r"dropout|keep.?prob"
TIED = r"\btie|\btied|tying|shared (weight|embedding)|same (weight|tensor|parameter) as the (input )?embedding"
EVAL = r"\beval|train\(\)|training mode|inference mode|\.training"
FROZEN = (r"frozen|freez|requires_grad|(does not|doesn't) require grad|no (trainable|parameter|gradient)|"
          r"(none|no) of the (parameters|weights)|never (updated|trained)|from_pretrained")
DUP_VAL = (r"overlap|leak|duplicat|identical|same (rows|samples|examples|images|inputs|sentences|texts)|"
           r"(appear|also|present|occur)\w* in (both|the training|train)|validation[^.]*training (samples|rows|data)")
SAMPLER = (r"WeightedRandomSampler|SubsetRandomSampler|sampler|distinct|few (samples|indices|examples)|"
           r"same (few )?(samples|indices|examples)|repeat|subset|only \d+ (of|out of)")
SAME_SAMPLE = (r"identical|same (sample|input|window|row|example|batch|item|clip|text)|duplicat|constant|distinct|"
               r"no variation|(does not|doesn't) (vary|change)|cach|index")
ZERO_GRAD = r"zero_grad|accumulat"
DIVIDED = (r"accumulat|divid|twice|double|scal(ed|ing)|1\s*/\s*\d+|too small|(gradient|update)s? [^.]*smaller|"
           r"\bnorm\b")
SHIFT = r"shift|offset|next.token|two (positions|tokens)|t ?\+ ?2|position"


def tiny_llama(tie=False, vocab=64):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tie, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(cfg)


def lm_batches(n=256, length=24, vocab=64, s=0, bs=16):
    ids = token_sequences(n, length, vocab, s=s)
    items = [{"input_ids": r, "attention_mask": torch.ones_like(r), "labels": r.clone()} for r in ids]
    return loader(items, bs)


# ----------------------------------------------------------------------------- what is trained

class MixtureOfScales(nn.Module):
    """Per-branch learnable scales kept in a plain Python list (not nn.ParameterList)."""

    def __init__(self):
        super().__init__()
        self.branches = nn.ModuleList([nn.Linear(16, 32) for _ in range(3)])
        self.scales = [nn.Parameter(torch.full((32,), 0.1)) for _ in range(3)]
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = sum(s * torch.relu(b(x)) for s, b in zip(self.scales, self.branches))
        return self.head(h)


@case("branch_scales_in_python_list", "what_is_trained",
      "the three branch scales are nn.Parameter objects kept in a plain Python list instead of nn.ParameterList, "
      "so the module does not register them: they get gradients but model.parameters() (and the optimizer) never "
      "see them", UNREGISTERED)
def branch_scales_in_python_list():
    seed(20)
    x, y = teacher_classes(768, 16, 4, s=20)
    model = MixtureOfScales()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=nn.CrossEntropyLoss())


class AttnPoolClassifier(nn.Module):
    def __init__(self, vocab=150):
        super().__init__()
        self.embed = nn.Embedding(vocab, 32)
        self.encoder = nn.LSTM(32, 32, batch_first=True)
        self.pool_query = nn.Parameter(torch.randn(32) * 0.1)
        self.pool_proj = nn.Linear(32, 32)
        self.classifier = nn.Linear(32, 3)

    def forward(self, ids):
        h, _ = self.encoder(self.embed(ids))
        w = torch.softmax(torch.tanh(self.pool_proj(h)) @ self.pool_query, dim=1)
        return self.classifier((w.unsqueeze(-1) * h).sum(1))


@case("attention_pool_missing_from_param_groups", "what_is_trained",
      "the optimizer's parameter groups list embed, encoder and classifier (different learning rates) but forget "
      "the attention-pooling query and projection, which get gradients and are never updated", NOT_IN_OPT)
def attention_pool_missing_from_param_groups():
    seed(21)
    g = torch.Generator().manual_seed(21)
    y = torch.randint(0, 3, (512,), generator=g)
    ids = torch.randint(5, 150, (512, 20), generator=g)
    pos = torch.randint(0, 20, (512,), generator=g)
    ids[torch.arange(512), pos] = y + 1
    model = AttnPoolClassifier()
    opt = torch.optim.Adam([
        {"params": model.embed.parameters(), "lr": 1e-3},
        {"params": model.encoder.parameters(), "lr": 2e-3},
        {"params": model.classifier.parameters(), "lr": 3e-3},
    ])
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(ids, y), 32),
                loss_fn=nn.CrossEntropyLoss())


class KeepProbCNN(nn.Module):
    def __init__(self, keep_prob=0.8):
        super().__init__()
        self.keep_prob = keep_prob
        self.conv = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 4)

    def forward(self, x):
        h = F.dropout(torch.relu(self.fc1(self.conv(x))), p=self.keep_prob, training=self.training)
        return self.fc2(h)


def colour_images(n, s=0, classes=4):
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, classes, (n,), generator=g)
    palette = torch.rand(classes, 3, 1, 1, generator=torch.Generator().manual_seed(99))
    return (palette[y] + 0.3 * torch.randn(n, 3, 16, 16, generator=g)), y


@case("cnn_functional_dropout_keep_prob", "what_is_trained",
      "the CNN ports TF1 code: F.dropout(h, p=self.keep_prob) with keep_prob=0.8, so 80% of the hidden units are "
      "dropped instead of 20%", DROPOUT)
def cnn_functional_dropout_keep_prob():
    seed(22)
    x, y = colour_images(512, s=22)
    model = KeepProbCNN(0.8)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=nn.CrossEntropyLoss())


@case("lstm_lm_dropout_keep_prob", "what_is_trained",
      "the word-level LSTM language model sets nn.LSTM(dropout=0.75) and nn.Dropout(0.75) from a config key "
      "'keep_prob: 0.75': three quarters of the activations are dropped between layers", DROPOUT)
def lstm_lm_dropout_keep_prob():
    seed(23)
    keep_prob = 0.75

    class LSTMLM(nn.Module):
        def __init__(self, vocab=50):
            super().__init__()
            self.emb = nn.Embedding(vocab, 32)
            self.drop = nn.Dropout(keep_prob)
            self.lstm = nn.LSTM(32, 64, num_layers=2, dropout=keep_prob, batch_first=True)
            self.out = nn.Linear(64, vocab)

        def forward(self, ids):
            h, _ = self.lstm(self.drop(self.emb(ids)))
            return self.out(self.drop(h))

    seqs = token_sequences(512, 21, 50, s=23)
    model = LSTMLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def loss_fn(model, batch):
        (s,) = batch
        logits = model(s[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), s[:, 1:].reshape(-1))

    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(seqs), 32), loss_fn=loss_fn)


@case("llama_lm_head_cloned_from_embeddings", "what_is_trained",
      "the Llama-style model is configured with tie_word_embeddings=True, but lm_head.weight is then set to "
      "nn.Parameter(embed_tokens.weight.clone()) 'to initialise it from the embeddings': the two are now separate "
      "tensors and the tie is silently broken", TIED)
def llama_lm_head_cloned_from_embeddings():
    seed(24)
    model = tiny_llama(tie=True)
    model.lm_head.weight = nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=opt, train_loader=lm_batches(s=24), loss_fn=None)


class BNResNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                   nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.3), nn.Linear(16, 4))

    def forward(self, x):
        h = self.stem(x)
        return self.head(torch.relu(h + self.block(h)))


def load_for_resume(model, state):
    model.load_state_dict(state)
    model.eval()                  # copied from the inference helper
    return model


@case("resnet_resume_helper_leaves_eval", "what_is_trained",
      "resuming from a checkpoint goes through the inference helper load_for_resume(), which calls model.eval(); "
      "the loop never calls model.train(), so BatchNorm uses frozen running stats and dropout is off all run", EVAL)
def resnet_resume_helper_leaves_eval():
    seed(25)
    x, y = colour_images(512, s=25)
    model = BNResNetish()
    model = load_for_resume(model, {k: v.clone() for k, v in model.state_dict().items()})
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=nn.CrossEntropyLoss())


class TextCNN(nn.Module):
    def __init__(self, vectors, classes=3):
        super().__init__()
        self.emb = nn.Embedding.from_pretrained(vectors)      # freeze=True by default
        self.conv = nn.Conv1d(vectors.size(1), 32, 3, padding=1)
        self.fc = nn.Linear(32, classes)

    def forward(self, ids):
        h = torch.relu(self.conv(self.emb(ids).transpose(1, 2)))
        return self.fc(h.max(-1).values)


@case("finetune_freeze_loop_after_new_head", "what_is_trained",
      "the freeze loop 'for p in model.parameters(): p.requires_grad = False' for the backbone runs AFTER the new "
      "head was attached, so the new head is frozen too and nothing in the model is trainable", FROZEN)
def finetune_freeze_loop_after_new_head():
    seed(26)
    x, y = colour_images(384, s=26, classes=3)
    model = BNResNetish()
    model.head[-1] = nn.Linear(16, 3)             # new task head
    for p in model.parameters():                  # meant: only the pretrained backbone, before the new head
        p.requires_grad = False
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=nn.CrossEntropyLoss())


@case("glove_embedding_from_pretrained_frozen", "what_is_trained",
      "nn.Embedding.from_pretrained(vectors) freezes the embedding by default (freeze=True) while the user means "
      "to fine-tune it: the vectors are in the optimizer but never receive a gradient", FROZEN)
def glove_embedding_from_pretrained_frozen():
    seed(27)
    g = torch.Generator().manual_seed(27)
    vectors = torch.randn(300, 24, generator=g)
    y = torch.randint(0, 3, (512,), generator=g)
    ids = torch.randint(4, 300, (512, 18), generator=g)
    ids[:, 0] = y + 1
    model = TextCNN(vectors)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)   # includes emb.weight, meant to be fine-tuned
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(ids, y), 32),
                loss_fn=nn.CrossEntropyLoss())


# ----------------------------------------------------------------------------- data by content

@case("crm_export_join_duplicates_then_split", "data",
      "the customer table was joined with a 3-row-per-customer contacts table, so every customer appears three "
      "times; random_split's disjoint indices still put copies of most training rows into validation", DUP_VAL)
def crm_export_join_duplicates_then_split():
    seed(28)
    x, y = teacher_classes(400, 14, 3, s=28)
    x, y = x.repeat_interleave(3, 0), y.repeat_interleave(3, 0)       # the join
    full = TensorDataset(x, y)
    train, val = random_split(full, [960, 240], generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(14, 48), nn.ReLU(), nn.Linear(48, 3))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(train, 32), val_loader=loader(val, 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


@case("scraped_reviews_repeated_pages_split", "data",
      "scraped product reviews were collected from paginated listings that repeat every review on four pages; "
      "the (B,T) token rows are split by index, so validation reviews are byte-identical copies of training ones",
      DUP_VAL)
def scraped_reviews_repeated_pages_split():
    seed(29)
    g = torch.Generator().manual_seed(29)
    n = 200
    y = torch.randint(0, 2, (n,), generator=g)
    ids = torch.randint(5, 250, (n, 24), generator=g)
    ids[:, 2] = y + 1
    ids, y = ids.repeat(4, 1), y.repeat(4)                  # page 1..4 of the listing
    train_idx = list(range(0, 640))
    val_idx = list(range(640, 800))                         # disjoint indices, same reviews
    full = TensorDataset(ids, y)

    class BagModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.EmbeddingBag(250, 32)
            self.fc = nn.Linear(32, 2)

        def forward(self, x):
            return self.fc(self.emb(x))

    model = BagModel()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(torch.utils.data.Subset(full, train_idx), 32),
                val_loader=loader(torch.utils.data.Subset(full, val_idx), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


@case("overfit_debug_subset_sampler_left_in", "data",
      "a SubsetRandomSampler(range(48)) from an 'overfit one batch' debug session was left in the training "
      "DataLoader: the 'epoch' only ever draws the first 48 of 6000 images", SAMPLER)
def overfit_debug_subset_sampler_left_in():
    seed(30)
    x, y = colour_images(6000, s=30)
    model = KeepProbCNN(0.1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sampler = SubsetRandomSampler(list(range(48)), generator=torch.Generator().manual_seed(0))
    return dict(model=model, optimizer=opt,
                train_loader=torch.utils.data.DataLoader(TensorDataset(x, y), batch_size=16, sampler=sampler),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


class StratifiedSampler(torch.utils.data.Sampler):
    """Hand-written 'balanced' sampler: draws a class, then an example of that class."""

    def __init__(self, labels, num_samples):
        self.labels = labels
        self.num_samples = num_samples
        self.by_class = [torch.nonzero(labels == c).flatten() for c in labels.unique()]

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(self.num_samples):
            c = torch.randint(len(self.by_class), (1,), generator=g).item()
            yield self.by_class[c][c].item()        # bug: indexes the class's members with c, meant a random j

    def __len__(self):
        return self.num_samples


@case("balanced_sampler_indexes_with_class_id", "data",
      "a hand-written class-balanced sampler picks the class c then yields by_class[c][c] instead of a random "
      "member of that class, so the whole epoch cycles over only 4 distinct rows", SAMPLER)
def balanced_sampler_indexes_with_class_id():
    seed(31)
    x, y = teacher_classes(2000, 12, 4, s=31)
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=opt,
                train_loader=torch.utils.data.DataLoader(TensorDataset(x, y), batch_size=32,
                                                         sampler=StratifiedSampler(y, 2000)),
                loss_fn=nn.CrossEntropyLoss())


class ClipDataset(Dataset):
    """Decodes a clip lazily and 'caches' it; the cache is a single slot, not a dict keyed by index."""

    def __init__(self, n, s=0):
        g = torch.Generator().manual_seed(s)
        self.labels = torch.randint(0, 3, (n,), generator=g)
        self.noise = torch.randn(n, 1, 256, generator=g) * 0.3
        self._cache = None

    def decode(self, i):
        t = torch.arange(256).float()
        return torch.sin(t * 0.1 * (self.labels[i].item() + 1)).view(1, 256) + self.noise[i], self.labels[i]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        if self._cache is None:
            self._cache = self.decode(i)
        return self._cache


@case("audio_clip_single_slot_cache", "data",
      "the dataset's decode cache is one slot (self._cache) rather than a dict keyed by index, so after the first "
      "call every index returns the same clip and label", SAME_SAMPLE)
def audio_clip_single_slot_cache():
    seed(32)
    model = nn.Sequential(nn.Conv1d(1, 16, 7, stride=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                          nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(ClipDataset(512, s=32), 32),
                loss_fn=nn.CrossEntropyLoss())


class EncodedTexts(Dataset):
    def __init__(self, enc, labels):
        self.enc, self.labels = enc, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        item = {k: v[0] for k, v in self.enc.items()}          # typo: meant v[idx]
        item["labels"] = self.labels[idx]
        return item


@case("distilbert_dataset_returns_row_zero", "data",
      "the HF-style Dataset's __getitem__ builds {k: v[0] for k, v in encodings.items()} (a typo for v[idx]), so "
      "every example has the first review's tokens while the labels vary: the inputs are identical", SAME_SAMPLE)
def distilbert_dataset_returns_row_zero():
    seed(33)
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    cfg = DistilBertConfig(vocab_size=120, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64,
                           num_labels=2, pad_token_id=0)
    model = DistilBertForSequenceClassification(cfg)
    g = torch.Generator().manual_seed(33)
    labels = torch.randint(0, 2, (256,), generator=g)
    ids = torch.randint(5, 120, (256, 20), generator=g)
    ids[:, 0] = 101 % 120
    ids[:, 1] = labels + 3
    enc = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
    return dict(model=model, optimizer=opt, train_loader=loader(EncodedTexts(enc, labels), 16), loss_fn=None)


# ----------------------------------------------------------------------------- accumulation / optimizer

ACCUM = 4


@case("accumulation_loss_divided_twice", "accumulation",
      "the loss function already returns loss / accumulation_steps and the training step (accumulation_steps=4) "
      "divides by it again, so every update is 1/16 of the mean gradient instead of 1/4 per micro-batch",
      DIVIDED)
def accumulation_loss_divided_twice():
    seed(34)
    x, y = teacher_classes(1024, 20, 5, s=34)
    model = nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.Linear(64, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ce = nn.CrossEntropyLoss()

    def loss_fn(model, batch):
        xb, yb = batch
        return ce(model(xb), yb) / ACCUM            # the trainer also divides by accumulation_steps

    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 16), loss_fn=loss_fn,
                accumulation_steps=ACCUM)


@case("gru_forward_hook_zero_grad_accumulation", "accumulation",
      "a forward pre-hook calls optimizer.zero_grad(set_to_none=True) 'to free memory early', so with "
      "accumulation_steps=8 each micro-batch's forward wipes the gradients accumulated so far", ZERO_GRAD)
def gru_forward_hook_zero_grad_accumulation():
    seed(35)
    g = torch.Generator().manual_seed(35)
    y = torch.randint(0, 3, (768,), generator=g)
    x = torch.randn(768, 16, 5, generator=g) + y.view(-1, 1, 1).float() * 0.5

    class GRUClf(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(5, 32, batch_first=True)
            self.fc = nn.Linear(32, 3)

        def forward(self, x):
            return self.fc(self.gru(x)[1][-1])

    model = GRUClf()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    model.register_forward_pre_hook(lambda module, args: opt.zero_grad(set_to_none=True))
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 8), loss_fn=nn.CrossEntropyLoss(),
                accumulation_steps=8)


@case("llama_collate_shifts_labels", "accumulation",
      "the collate_fn builds input_ids = ids[:, :-1] and labels = ids[:, 1:] for LlamaForCausalLM, which shifts "
      "the labels again inside its loss: the model learns to predict the token two positions ahead", SHIFT)
def llama_collate_shifts_labels():
    seed(36)
    model = tiny_llama(tie=False)
    ids = token_sequences(256, 25, 64, s=36)

    def collate(rows):
        b = torch.stack([r[0] for r in rows])
        return {"input_ids": b[:, :-1], "attention_mask": torch.ones_like(b[:, :-1]), "labels": b[:, 1:]}

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(ids), 16, collate_fn=collate),
                loss_fn=None)
