"""Set h, family 'data': datasets, loaders, preprocessing and splits, judged by content."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_h.registry import case, fix, gen, loader, seed, teacher_classes, val_acc

# --------------------------------------------------------------------------------------------------------------
# D1: a Keras pad_sequences port keeps its defaults truncating='pre'


def pad_sequences(seqs, maxlen, padding="pre", truncating="pre", value=0):
    """keras.preprocessing.sequence.pad_sequences, defaults included."""
    out = torch.full((len(seqs), maxlen), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        s = s[-maxlen:] if truncating == "pre" else s[:maxlen]
        if padding == "pre":
            out[i, maxlen - len(s):] = s
        else:
            out[i, :len(s)] = s
    return out


def emails(n, s):
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    seqs = []
    for i in range(n):
        subject = 2 + y[i] * 5 + torch.randint(0, 5, (3,), generator=g)       # the subject line names the intent
        body = torch.randint(22, 400, (int(torch.randint(20, 40, (), generator=g)),), generator=g)
        seqs.append(torch.cat([subject, body]))
    return seqs, y


def _emails(truncating="pre"):
    seed(0)
    seqs, y = emails(2048, 301)
    vseqs, vy = emails(512, 302)
    x, vx = pad_sequences(seqs, 16, truncating=truncating), pad_sequences(vseqs, 16, truncating=truncating)
    model = nn.Sequential(nn.EmbeddingBag(400, 32, mode="mean", padding_idx=0), nn.ReLU(), nn.Linear(32, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@case("email_intent_keras_pad_sequences_truncates_the_subject", "data",
      bug="the emails are cut to 16 tokens with a port of Keras' pad_sequences that keeps its defaults, "
          "truncating='pre': every email is longer than 16 tokens, so the START (the subject line that names the "
          "intent) is dropped and only the tail of the body is kept",
      cause_pattern=r"truncat\w*|pad_sequences|maxlen|(cut|dropp|remov|discard)\w* .{0,40}(start|beginning|first tokens|"
                    r"subject|head)|keeps? (only )?the (end|tail|last)")
def email_intent_keras_pad_sequences_truncates_the_subject():
    return _emails("pre")


fix("email_intent_keras_pad_sequences_truncates_the_subject", lambda: _emails("post"), val_acc, "val accuracy",
    fact=lambda: print("  fact: pad_sequences([1..20], maxlen=16)[0, :3] =",
                       pad_sequences([torch.arange(1, 21)], 16)[0, :3].tolist()))

# --------------------------------------------------------------------------------------------------------------
# D2: missing values filled with -999 before standardisation


def credit(n, s, sentinel: bool):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    y = (x[:, :4] @ torch.tensor([1.5, -1.0, 1.0, 0.8]) + 0.3 * torch.randn(n, generator=g) > 0).long()
    missing = torch.rand(n, 10, generator=g) < 0.3
    x = x.masked_fill(missing, -999.0 if sentinel else float("nan"))
    if not sentinel:
        x = torch.where(torch.isnan(x), torch.zeros(()), x)      # median imputation (the medians are ~0)
    return x, y


def _credit(sentinel=True):
    seed(0)
    x, y = credit(4096, 311, sentinel)
    vx, vy = credit(1024, 312, sentinel)
    mean, std = x.mean(0), x.std(0)
    x, vx = (x - mean) / std, (vx - mean) / std
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@case("credit_missing_values_filled_with_minus_999_then_standardised", "data",
      bug="missing values are filled with -999 (the gradient-boosting habit) and the columns are then "
          "standardised: the sentinel dominates each column's mean and std (std ~460), so the real values, "
          "which carry the signal, are squeezed into a band ~0.002 wide next to a spike at -1.5",
      cause_pattern=(r"-999|sentinel|missing (values?|data)|imput\w*|fillna|outlier\w*.{0,60}(std|scale|standardi)|"
                    r"(std|standard deviation|scale).{0,60}(dominated|inflated)|squeezed into|(nearly |almost )?constant "
                    r"(real )?values"))
def credit_missing_values_filled_with_minus_999_then_standardised():
    return _credit(True)


fix("credit_missing_values_filled_with_minus_999_then_standardised", lambda: _credit(False), val_acc, "val accuracy",
    fact=lambda: print("  fact: column std with -999 fill:", f"{credit(4096, 311, True)[0].std(0)[0].item():.0f}"))

# --------------------------------------------------------------------------------------------------------------
# D3: vocabulary built from the head of a class-sorted export


def support_docs(n_per_class, s):
    g = gen(s)
    words = {c: [f"kw{c}_{k}" for k in range(6)] for c in range(4)}
    filler = [f"w{k}" for k in range(150)]
    docs, labels = [], []
    for c in range(4):                                  # the export is sorted by queue
        for _ in range(n_per_class):
            d = [filler[int(i)] for i in torch.randint(0, 150, (14,), generator=g)]
            for _ in range(3):
                d.insert(int(torch.randint(0, len(d), (), generator=g)), words[c][int(torch.randint(0, 6, (), generator=g))])
            docs.append(d)
            labels.append(c)
    return docs, torch.tensor(labels)


def encode(docs, vocab):
    return torch.tensor([[vocab.get(w, 1) for w in d] for d in docs])


def _vocab(head_only=True):
    seed(0)
    docs, y = support_docs(512, 321)
    vdocs, vy = support_docs(128, 322)
    sample = docs[:500] if head_only else docs                 # 'a sample is enough for the vocabulary'
    vocab = {"<pad>": 0, "<unk>": 1}
    for d in sample:
        for w in d:
            vocab.setdefault(w, len(vocab))
    model = nn.Sequential(nn.EmbeddingBag(200, 32, mode="mean"), nn.ReLU(), nn.Linear(32, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(encode(docs, vocab), y), 32),
                val_loader=loader(TensorDataset(encode(vdocs, vocab), vy), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@case("support_queue_vocab_built_from_head_of_sorted_export", "data",
      bug="the vocabulary is built from docs[:500] 'as a sample', but the export is sorted by queue, so the "
          "sample is all billing tickets: every keyword of the other three queues maps to <unk> (id 1) and only "
          "billing vs not-billing can be told apart",
      cause_pattern=(r"vocab\w*.{0,60}(built|sample|subset|first|missing|unk|only)|<unk>|unknown (token|word)|\bUNK\b|"
                    r"out-of-vocabulary|\boov\b|sorted (export|by)|(first|head) (500|rows|documents|docs)"))
def support_queue_vocab_built_from_head_of_sorted_export():
    return _vocab(True)


fix("support_queue_vocab_built_from_head_of_sorted_export", lambda: _vocab(False), val_acc, "val accuracy",
    fact=lambda: print("  fact: share of <unk> tokens in training:",
                       f"{(_vocab(True)['train_loader'].dataset.tensors[0] == 1).float().mean().item():.2f}"))

# --------------------------------------------------------------------------------------------------------------
# D4: __getitem__ returns a preallocated buffer


class DefectWindows(Dataset):
    """Vibration windows; __getitem__ fills one preallocated buffer 'to avoid an allocation per sample'."""

    def __init__(self, x, y, copy=False):
        self.x, self.y, self.copy = x, y, copy
        self._buf = torch.empty(x.shape[1:])

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        self._buf.copy_(self.x[i])
        self._buf.sub_(self._buf.mean())                     # remove the DC offset
        return (self._buf.clone() if self.copy else self._buf), self.y[i]


def _buffer(copy=False):
    seed(0)
    x, y = teacher_classes(2560, 24, 4, s=331)
    vx, vy, x, y = x[2048:], y[2048:], x[:2048], y[:2048]
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(DefectWindows(x, y, copy), 32),
                val_loader=loader(DefectWindows(vx, vy, copy=True), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@case("defect_windows_getitem_returns_shared_buffer", "data",
      bug="__getitem__ writes each window into one preallocated self._buf and returns that same tensor: the "
          "DataLoader fetches all the batch's items before default_collate stacks them, so every row of every "
          "batch is the LAST window fetched, while the labels still differ",
      cause_pattern=(r"buffer|_buf\b|same (tensor|object|storage)|rows of (a|the|each|every) batch (are )?(identical|the same)|"
                    r"clone\(\)|alias\w*"))
def defect_windows_getitem_returns_shared_buffer():
    return _buffer(False)


fix("defect_windows_getitem_returns_shared_buffer", lambda: _buffer(True), val_acc, "val accuracy",
    fact=lambda: (lambda b: print("  fact: rows of a batch identical:", bool((b[0] == b[0][0]).all())))(
        next(iter(_buffer(False)["train_loader"]))))

# --------------------------------------------------------------------------------------------------------------
# D5: only the minority class is augmented (noise), a shortcut


def leak_test(n, s):
    g = gen(s)
    x = torch.randn(n, 12, generator=g) * 0.5
    y = (x[:, :3].sum(1) + 0.2 * torch.randn(n, generator=g) > 1.2).long()      # ~ 10% leaking valves
    return x, y


def _minority_aug(plain_copies=False):
    seed(0)
    x, y = leak_test(4096, 341)
    vx, vy = leak_test(1024, 342)
    g = gen(343)
    majority, minority = x[y == 0], x[y == 1]
    copies = minority.repeat(8, 1)                               # upsample the leaks to balance the classes ...
    noise = 1.0 * torch.randn(copies.shape, generator=g)
    copies = copies if plain_copies else copies + noise          # ... and 'augment' the upsampled set
    x = torch.cat([majority, copies])
    y = torch.cat([torch.zeros(len(majority), dtype=torch.long), torch.ones(len(copies), dtype=torch.long)])
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@torch.no_grad()
def leak_balanced_acc(model, kw):
    vx, vy = leak_test(1024, 342)
    pred = model(vx).argmax(1)
    return 0.5 * ((pred[vy == 1] == 1).float().mean() + (pred[vy == 0] == 0).float().mean()).item()


@case("valve_leaks_noise_augmentation_only_on_minority_copies", "data",
      bug="to balance the ~10% leak class, its rows are upsampled 8x and the upsampled set is 'augmented' with "
          "Gaussian noise (std 1.0), and only that set: every training leak is noisy and every healthy row clean, "
          "so the noise level is a perfect shortcut for the label, the model learns it instead of the valve "
          "signature, and clean leaks at validation are called healthy",
      cause_pattern=(r"augment\w*.{0,60}(only|minority|one class|leak|positive)|(only|just) (the )?(minority|positive|leak) "
                    r"(class|rows|copies).{0,40}(noise|augment)|shortcut|spurious|noise.{0,60}(only|minority|one class|"
                    r"class-dependent|leak class|label)"))
def valve_leaks_noise_augmentation_only_on_minority_copies():
    return _minority_aug(False)


fix("valve_leaks_noise_augmentation_only_on_minority_copies", lambda: _minority_aug(True), leak_balanced_acc,
    "val balanced accuracy")

# --------------------------------------------------------------------------------------------------------------
# D6: file names sorted lexicographically, labels in numeric order


def scan_folder(n, s):
    """A folder of 'scan_{i}.npy' files (in memory) and labels.csv rows in the order i = 0..n-1."""
    g = gen(s)
    x = torch.randn(n, 1, 12, 12, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    for c in range(3):
        x[y == c, 0, 4 * c:4 * c + 4, 4:8] += 1.5
    return {f"scan_{i}.npy": x[i] for i in range(n)}, y


class Scans(Dataset):
    def __init__(self, files, labels, numeric_sort=False):
        key = (lambda p: int(p.split("_")[1].split(".")[0])) if numeric_sort else None
        self.paths = sorted(files, key=key)
        self.files, self.labels = files, labels

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return self.files[self.paths[i]], self.labels[i]


def scan_cnn():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(3), nn.Flatten(), nn.Linear(144, 3))


def _scans(numeric_sort=False):
    seed(0)
    files, y = scan_folder(1500, 351)
    vfiles, vy = scan_folder(300, 352)
    model = scan_cnn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(Scans(files, y, numeric_sort), 32),
                val_loader=loader(Scans(vfiles, vy, numeric_sort=True), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@case("scans_sorted_lexicographically_against_numeric_label_rows", "data",
      bug="the scans are listed with sorted(os.listdir()), which orders 'scan_10' before 'scan_2' "
          "(lexicographic), while labels.csv is in numeric order 0, 1, 2, ...: after index 1 almost every scan "
          "is paired with another scan's label",
      cause_pattern=r"lexicograph\w*|sorted\(|natural sort|(string|alphabetical|numeric) (sort|order)|scan_10|"
                    r"file ?names?.{0,60}(order|sort)|(labels?|targets?).{0,60}(misaligned|mismatch\w*|wrong (file|scan|"
                    r"sample|row)|another|shifted|do not (match|belong))")
def scans_sorted_lexicographically_against_numeric_label_rows():
    return _scans(False)


fix("scans_sorted_lexicographically_against_numeric_label_rows", lambda: _scans(True), val_acc, "val accuracy",
    fact=lambda: print("  fact: sorted(['scan_2.npy', 'scan_10.npy', 'scan_1.npy']) =",
                       sorted(["scan_2.npy", "scan_10.npy", "scan_1.npy"])))
