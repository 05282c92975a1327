"""Set ac, family data: what reaches the model is not what the user believes it is."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_ac.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed


def argmax_acc():
    return acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]))


def mlp(d_in, d_out, hidden=64):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, d_out))


# --- validation features never standardised ----------------------------------------------------------------------

def applicant_table(n, s):
    """Loan applicants in raw units (age, income, debt, years employed, 4 ratios); approved = nonlinear rule."""
    g = gen(s)
    z = torch.randn(n, 8, generator=g)
    raw = z * torch.tensor([12., 18000., 9000., 6., 1., 1., 1., 1.]) + torch.tensor([42., 52000., 20000., 9., 0, 0, 0, 0])
    score = z[:, 1] - z[:, 2] + 0.6 * z[:, 0] * z[:, 3] + 0.5 * z[:, 4]
    return raw, torch.bucketize(score, torch.tensor([-0.6, 0.6]))


@case("validation_features_not_standardized", "data",
      bug="StandardScaler-style statistics are fitted on the training features and applied to them, but the "
          "validation features are passed in raw units (ages ~40, incomes ~50,000): the validation inputs are on a "
          "scale the network never saw, so validation accuracy collapses while training looks fine.",
      cause_pattern=r"\b(validation|val|eval|evaluation|test)\b.{0,120}(not (scaled|standardi[sz]ed|normali[sz]ed|"
                    r"transformed)|raw (units|values|features)|unscaled|different (scale|range|distribution|statistics))|"
                    r"(scaler|standardi[sz]ation|normali[sz]ation|mean and std|training statistics)\w*.{0,120}"
                    r"\b(validation|val_loader|val|eval)\b|\b(train|training)\b.{0,60}\b(and|vs\.?|versus)\b "
                    r"\b(validation|val)\b.{0,60}(scale|range|distribution|statistics)")
def validation_features_not_standardized(fixed=False):
    seed(0)
    x, y = applicant_table(2000, 41)
    mean, std = x[:1500].mean(0), x[:1500].std(0)
    x_train = (x[:1500] - mean) / std
    x_val = (x[1500:] - mean) / std if fixed else x[1500:]
    model = mlp(8, 3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x_train, y[:1500]), 32),
                val_loader=loader(TensorDataset(x_val, y[1500:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("validation_features_not_standardized", fixed_of(validation_features_not_standardized), argmax_acc(),
    "val accuracy", steps=300)


# --- reviews truncated before the words that carry the label ------------------------------------------------------

def long_reviews(n, s, length=48):
    """Token ids (n, 48): a preamble of filler (ids 10..199) and, in the second half, 3 opinion words
    (2..5 negative, 6..9 positive)."""
    g = gen(s)
    y = torch.randint(0, 2, (n,), generator=g)
    ids = torch.randint(10, 200, (n, length), generator=g)
    for i in range(n):
        pos = 16 + torch.randperm(length - 16, generator=g)[:3]
        ids[i, pos] = 2 + 4 * y[i] + torch.randint(0, 4, (3,), generator=g)
    return ids, y


class ReviewBag(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.EmbeddingBag(200, 32, mode="mean")
        self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, ids):
        return self.head(self.embed(ids))


@case("max_length_truncates_signal", "data",
      bug="The review tokens are truncated to max_length=16 (a value copied from a tweet example), but in these "
          "48-token reviews the opinion words come after the 16-token preamble: every kept token is filler, the "
          "inputs carry no information about the label, and accuracy stays at chance.",
      cause_pattern=r"max_length|\bmax_len\b.{0,40}(truncat|short|cut)|truncat\w*.{0,60}(token|sequence|review|text|input)|(first|only) \d+ tokens|(sequence|input|review|text)s? (are |is )?"
                    r"(cut|clipped|shortened)|(inputs?|features?|tokens?).{0,60}(no|carry no|without) (information|"
                    r"signal).{0,40}(label|target)")
def max_length_truncates_signal(fixed=False):
    seed(0)
    ids, y = long_reviews(1800, 42)
    max_length = 48 if fixed else 16
    ids = ids[:, :max_length]
    model = ReviewBag()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(ids[:1400], y[:1400]), 32),
                val_loader=loader(TensorDataset(ids[1400:], y[1400:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("max_length_truncates_signal", fixed_of(max_length_truncates_signal), argmax_acc(), "val accuracy", steps=300)


# --- a raw Unix timestamp column among standardised features ------------------------------------------------------

def delivery_log(n, s):
    """Delivery records: 7 standardised features plus the order's Unix timestamp (seconds, ~1.7e9); the
    delivery time (standardised) depends on the features, not on the timestamp."""
    g = gen(s)
    z = torch.randn(n, 7, generator=g)
    ts = 1.70e9 + 3.0e7 * torch.rand(n, 1, generator=g)
    y = 1.5 * torch.tanh(z[:, 0] - z[:, 1]) + 0.5 * z[:, 2] * z[:, 3] + 0.1 * torch.randn(n, generator=g)
    return torch.cat([z, ts], 1), y.unsqueeze(1)


@case("raw_unix_timestamp_feature", "data",
      bug="The order's raw Unix timestamp (about 1.7e9 seconds) is left as the eighth input column next to "
          "standardised features: its pre-activations are nine orders of magnitude larger than the others, the "
          "first layer is swamped and the regression never fits (the column should be dropped or scaled).",
      cause_pattern=r"timestamp|epoch (time|seconds)|1\.7e\+?0?9|\b1e9\b|\b(column|feature|input) (7|8|#8|index 7)\b|"
                    r"(one|a single|eighth|last) (input )?(column|feature)\w*.{0,100}(scale|magnitude|large|huge|dominat)")
def raw_unix_timestamp_feature(fixed=False):
    seed(0)
    x, y = delivery_log(2000, 43)
    if fixed:
        x = torch.cat([x[:, :7], (x[:, 7:] - x[:1500, 7:].mean()) / x[:1500, 7:].std()], 1)
    model = mlp(8, 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 32),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 128, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1500)


fix("raw_unix_timestamp_feature", fixed_of(raw_unix_timestamp_feature), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", steps=300, higher=False)


# --- horizontal-flip augmentation on a task where left and right are classes -----------------------------------

def arrow_icons(n, s):
    """(n, 1, 12, 12) icons: a ramp patch pointing left, right, up or down (classes 0..3), noisy, anywhere."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.3 * torch.randn(n, 1, 12, 12, generator=g)
    ramp = torch.linspace(1.5, 0.0, 6)
    patches = [ramp.repeat(6, 1), ramp.flip(0).repeat(6, 1), ramp.unsqueeze(1).repeat(1, 6),
               ramp.flip(0).unsqueeze(1).repeat(1, 6)]
    r = torch.randint(0, 7, (n,), generator=g)
    c = torch.randint(0, 7, (n,), generator=g)
    for i in range(n):
        x[i, 0, r[i]:r[i] + 6, c[i]:c[i] + 6] += patches[y[i]]
    return x, y


class FlipAugmented(Dataset):
    def __init__(self, x, y, hflip):
        self.x, self.y, self.hflip = x, y, hflip

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        img = self.x[i]
        if self.hflip and torch.rand(()) < 0.5:        # RandomHorizontalFlip(p=0.5)
            img = img.flip(-1)
        return img, self.y[i]


def icon_cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))


@case("hflip_augmentation_swaps_left_right_classes", "data",
      bug="The training Dataset applies RandomHorizontalFlip(p=0.5) to arrow icons whose classes include 'left' "
          "and 'right': a flip turns a left arrow into a right one while its label stays 'left', so half of those "
          "training labels contradict the images and the two classes cannot be told apart.",
      cause_pattern=r"flip|augment\w*.{0,100}(label|class)|(label|class)\w*.{0,100}augment|mirror|orientation")
def hflip_augmentation_swaps_left_right_classes(fixed=False):
    seed(0)
    x, y = arrow_icons(1600, 44)
    model = icon_cnn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(FlipAugmented(x[:1200], y[:1200], hflip=not fixed), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("hflip_augmentation_swaps_left_right_classes", fixed_of(hflip_augmentation_swaps_left_right_classes),
    argmax_acc(), "val accuracy", steps=300)


# --- vocabulary rebuilt on the validation texts -----------------------------------------------------------------

def ticket_texts(n, s):
    """Support tickets as word lists: 12 filler words and 2 words of the ticket's team (4 teams)."""
    g = gen(s)
    filler = [f"w{i}" for i in range(120)]
    team_words = [[f"t{k}_{j}" for j in range(10)] for k in range(4)]
    texts, labels = [], []
    for _ in range(n):
        k = int(torch.randint(0, 4, (1,), generator=g))
        words = [filler[int(i)] for i in torch.randint(0, 120, (12,), generator=g)]
        words += [team_words[k][int(j)] for j in torch.randint(0, 10, (2,), generator=g)]
        order = torch.randperm(len(words), generator=g).tolist()
        texts.append([words[i] for i in order])
        labels.append(k)
    return texts, torch.tensor(labels)


def build_vocab(texts):
    vocab = {"<unk>": 0}
    for words in texts:
        for w in words:
            vocab.setdefault(w, len(vocab))
    return vocab


def encode(texts, vocab):
    return torch.tensor([[vocab.get(w, 0) for w in words] for words in texts])


@case("vocab_rebuilt_on_validation_texts", "data",
      bug="The validation tickets are encoded with a vocabulary built again from the validation texts "
          "(build_vocab(val_texts)) instead of the training vocabulary: the same word gets a different id in the "
          "two splits, so validation inputs are scrambled ids and validation accuracy sits near chance while "
          "training accuracy is high.",
      cause_pattern=r"vocab\w*.{0,80}(rebuilt|re-?built|built (again|separately|on|from) (the )?(val|test)|refit|different|"
                    r"inconsistent|per split|each split)|\b(val|validation|test)\b.{0,60}vocab|build_vocab|word.?(to.?)?(id|index)|token.?(to.?)?id|tokeni[sz]er\w*.{0,80}(fit|built|trained|refit)|"
                    r"(different|inconsistent|mismatch\w*) (id|index|encoding|mapping)|(id|index|encoding|mapping)s? "
                    r"(differ|mismatch|inconsistent)")
def vocab_rebuilt_on_validation_texts(fixed=False):
    seed(0)
    texts, y = ticket_texts(1800, 45)
    train_vocab = build_vocab(texts[:1400])
    val_vocab = train_vocab if fixed else build_vocab(texts[1400:])
    x_train, x_val = encode(texts[:1400], train_vocab), encode(texts[1400:], val_vocab)
    size = max(len(train_vocab), len(build_vocab(texts[1400:])), 1) + 1
    model = nn.Sequential(nn.EmbeddingBag(size, 32, mode="mean"), nn.Linear(32, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x_train, y[:1400]), 32),
                val_loader=loader(TensorDataset(x_val, y[1400:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("vocab_rebuilt_on_validation_texts", fixed_of(vocab_rebuilt_on_validation_texts), argmax_acc(),
    "val accuracy", steps=300)
