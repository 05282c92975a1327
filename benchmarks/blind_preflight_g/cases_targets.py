"""Set g, family `targets`: what the loss is asked to fit."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_g.registry import case, fix, loader, seed

# --------------------------------------------------------------------------- 1: in-batch contrastive labels all 0


def photo_captions(n=3000, d_img=24, vocab=60, words=6, s=0):
    """Photo features and caption word ids generated from one latent scene vector."""
    g = torch.Generator().manual_seed(s)
    z = torch.randn(n, 8, generator=g)
    img = z @ torch.randn(8, d_img, generator=g) + 0.3 * torch.randn(n, d_img, generator=g)
    word_proj = torch.randn(8, vocab, generator=g)
    logits = (z @ word_proj)[:, None, :].expand(n, words, vocab) * 1.5
    cap = torch.distributions.Categorical(logits=logits).sample()
    return img, cap


class DualEncoder(nn.Module):
    def __init__(self, d_img=24, vocab=60, dim=32, learn_scale=False):
        super().__init__()
        self.img = nn.Sequential(nn.Linear(d_img, 64), nn.ReLU(), nn.Linear(64, dim))
        self.word = nn.EmbeddingBag(vocab, 64, mode="mean")
        self.txt = nn.Sequential(nn.ReLU(), nn.Linear(64, dim))
        self.logit_scale = nn.Parameter(torch.tensor(2.3)) if learn_scale else None

    def forward(self, img, cap):
        a = F.normalize(self.img(img), dim=-1)
        b = F.normalize(self.txt(self.word(cap)), dim=-1)
        scale = self.logit_scale.exp() if self.logit_scale is not None else 10.0
        return scale * a @ b.T


def moco_style_loss(model, batch):
    img, cap = batch
    logits = model(img, cap)
    labels = torch.zeros(logits.size(0), dtype=torch.long)     # the positive is column 0
    return F.cross_entropy(logits, labels)


def clip_loss(model, batch):
    img, cap = batch
    logits = model(img, cap)
    labels = torch.arange(logits.size(0))
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


@torch.no_grad()
def retrieval_top1(model, kw):
    model.eval()
    img, cap = kw["val_loader"].dataset.tensors
    hit = (model(img[:200], cap[:200]).argmax(1) == torch.arange(200)).float().mean().item()
    model.train()
    return hit


def _captions(fix=False):
    seed(0)
    img, cap = photo_captions(s=11)
    model = DualEncoder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(img[:2600], cap[:2600]), 64, drop_last=True),
                val_loader=loader(TensorDataset(img[2600:], cap[2600:]), 200, shuffle=False),
                loss_fn=clip_loss if fix else moco_style_loss, max_steps=3000)


@case("photo_caption_contrastive_labels_all_zero", "targets",
      bug="the image-caption loss was ported from MoCo, whose logits put the positive in column 0 "
          "(labels = torch.zeros(N)), but here the logits are the in-batch (B, B) similarity matrix whose positives "
          "are on the diagonal: every photo is trained to match the first caption of its batch, and its own caption "
          "is pushed away like a negative (labels = torch.arange(B) is the fix)",
      cause_pattern=r"torch\.zeros|column 0|first (column|caption)|diagonal|arange|(positive|matching) (pairs?|caption"
                    r"s?|items?|columns?)[^.]*(index|position|column|diagonal)|(labels?|targets?)[^.]*(all|always|ever"
                    r"y|only)[^.]*\b(0|zero|class 0)\b|MoCo")
def photo_caption_contrastive_labels_all_zero():
    return _captions()


def _fact_captions():
    kw = _captions()
    img, cap = next(iter(kw["train_loader"]))
    print(f"  logits {tuple(kw['model'](img, cap).shape)}: positives on the diagonal; labels all 0")


fix("photo_caption_contrastive_labels_all_zero", lambda: _captions(True), retrieval_top1,
    "val image->caption top-1 of 200", _fact_captions)

# --------------------------------------------------------------------------- 2: MarginRankingLoss arguments swapped


def query_doc_pairs(n=4000, d=16, s=0):
    """(query-document features of a relevant doc, of an irrelevant doc) for the same query."""
    g = torch.Generator().manual_seed(s)
    w = torch.randn(d, generator=g)
    a, b = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    a_better = (a @ w > b @ w)[:, None]
    return torch.where(a_better, a, b), torch.where(a_better, b, a)


class Scorer(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


RANK_LOSS = nn.MarginRankingLoss(margin=1.0)


def ranking_loss_swapped(model, batch):
    relevant, irrelevant = batch
    ones = torch.ones(len(relevant))
    return RANK_LOSS(model(irrelevant), model(relevant), ones)


def ranking_loss(model, batch):
    relevant, irrelevant = batch
    ones = torch.ones(len(relevant))
    return RANK_LOSS(model(relevant), model(irrelevant), ones)


@torch.no_grad()
def pair_acc(model, kw):
    rel, irr = kw["val_loader"].dataset.tensors
    return (model(rel) > model(irr)).float().mean().item()


def _ranker(fix=False):
    seed(0)
    rel, irr = query_doc_pairs(s=12)
    model = Scorer()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(rel[:3500], irr[:3500]), 64),
                val_loader=loader(TensorDataset(rel[3500:], irr[3500:]), 250, shuffle=False),
                loss_fn=ranking_loss if fix else ranking_loss_swapped, max_steps=2000)


@case("search_ranker_margin_ranking_arguments_swapped", "targets",
      bug="MarginRankingLoss(x1, x2, y=1) asks x1 to score above x2, and the loss is called as "
          "loss(score(irrelevant), score(relevant), ones): the arguments are in the wrong order, so the ranker is "
          "trained to put the irrelevant document above the relevant one and learns the reversed ranking "
          "(loss(score(relevant), score(irrelevant), ones), or target -1)",
      cause_pattern=r"MarginRanking|margin.?ranking|(argument|input)s?[^.]*(order|swap)|swap\w*[^.]*(argument|input|"
                    r"relevant|positive|negative)|revers\w*[^.]*(rank|order|preference)|(rank\w*|order|preference)[^.]*"
                    r"(revers|invert|backwards|opposite)|(irrelevant|negative)[^.]*(ranked|scored|placed) (above|higher)"
                    r"|target\s*=?\s*-1")
def search_ranker_margin_ranking_arguments_swapped():
    return _ranker()


def _fact_ranker():
    hi, lo = torch.tensor([2.0]), torch.tensor([0.0])
    print(f"  MarginRankingLoss(x1=2, x2=0, y=1) = {RANK_LOSS(hi, lo, torch.ones(1)).item():.1f}; "
          f"(x1=0, x2=2, y=1) = {RANK_LOSS(lo, hi, torch.ones(1)).item():.1f}: y=1 rewards x1 > x2")


fix("search_ranker_margin_ranking_arguments_swapped", lambda: _ranker(True), pair_acc,
    "val pairs ranked correctly", _fact_ranker)

# --------------------------------------------------------------------------- 3: pinball residual sign flipped

Q = 0.9


def store_demand(n=4000, d=8, s=0):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, d, generator=g)
    mean = x[:, 0] + 0.5 * x[:, 1]
    scale = 0.5 + 0.4 * x[:, 2].abs()
    return x, mean + scale * torch.randn(n, generator=g)


class QuantileMLP(nn.Module):
    def __init__(self, d=8, quantiles=1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, quantiles))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def pinball_flipped(model, batch):
    x, y = batch
    err = model(x) - y
    return torch.maximum(Q * err, (Q - 1) * err).mean()


def pinball(model, batch):
    x, y = batch
    err = y - model(x)
    return torch.maximum(Q * err, (Q - 1) * err).mean()


@torch.no_grad()
def coverage_error(model, kw):
    x, y = kw["val_loader"].dataset.tensors
    return -abs((y <= model(x)).float().mean().item() - Q)


def _demand(fix=False):
    seed(0)
    x, y = store_demand(s=13)
    model = QuantileMLP()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:3400], y[:3400]), 64),
                val_loader=loader(TensorDataset(x[3400:], y[3400:]), 200, shuffle=False),
                loss_fn=pinball if fix else pinball_flipped, max_steps=2000)


@case("demand_p90_pinball_residual_sign_flipped", "targets",
      bug="the P90 demand forecaster's pinball loss uses err = pred - y in max(q * err, (q - 1) * err), the residual "
          "with the wrong sign: the asymmetry is mirrored, so the model fits the 10th percentile (about 10% of "
          "the demand below the forecast) instead of the 90th (err = y - pred is the fix)",
      cause_pattern=r"quantile|pinball|percentile|(residual|error|err)[^.]*(sign|revers|flip|mirror|y ?- ?pred|"
                    r"pred\w* ?- ?(y|target))|1 ?- ?q\b|coverage")
def demand_p90_pinball_residual_sign_flipped():
    return _demand()


def _fact_demand():
    y, pred = torch.zeros(1), torch.ones(1)
    e = pred - y
    print(f"  over-forecast by 1: flipped loss {torch.maximum(Q * e, (Q - 1) * e).item():.1f} (a P90 loss charges "
          f"{1 - Q:.1f})")


fix("demand_p90_pinball_residual_sign_flipped", lambda: _demand(True), coverage_error,
    "-|val coverage - 0.9|", _fact_demand)

# --------------------------------------------------------------------------- 4: Poisson softplus rate as log-rate


def ward_admissions(n=4000, d=10, s=0):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, d, generator=g)
    rate = torch.exp(-1.2 + 0.6 * x[:, 0] - 0.4 * x[:, 1])
    return x, torch.poisson(rate, generator=g)


class RateMLP(nn.Module):
    """Ends in Softplus: the output is the expected number of admissions."""

    def __init__(self, d=10, softplus=True):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 1))
        self.softplus = softplus

    def forward(self, x):
        out = self.net(x).squeeze(-1)
        return F.softplus(out) if self.softplus else out


@torch.no_grad()
def poisson_deviance(model, kw):
    """Mean Poisson NLL of the validation counts under the rate the model is used for."""
    x, y = kw["val_loader"].dataset.tensors
    out = model(x)
    rate = out if model.softplus else out.exp()
    return -F.poisson_nll_loss(rate, y, log_input=False, full=False).item()


def _admissions(fix=False):
    seed(0)
    x, y = ward_admissions(s=14)
    model = RateMLP()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:3400], y[:3400]), 64),
                val_loader=loader(TensorDataset(x[3400:], y[3400:]), 200, shuffle=False),
                loss_fn=nn.PoissonNLLLoss(log_input=False) if fix else nn.PoissonNLLLoss(), max_steps=2000)


@case("ward_admissions_softplus_rate_into_log_input_poisson", "targets",
      bug="the admissions model ends in Softplus and outputs the expected count, but nn.PoissonNLLLoss() defaults to "
          "log_input=True and treats that output as the log of the rate: the fitted rate is exp(softplus(.)) >= 1 "
          "while most wards average 0.1-1 admissions, and the output the forecasts are read from is not the rate at "
          "all (PoissonNLLLoss(log_input=False), or drop the Softplus)",
      cause_pattern=r"log_input|PoissonNLL|log.?(rate|space)|(rate|mean|output)s?[^.]*(exp\b|exponent|treated as (the "
                    r")?log)|softplus[^.]*(log|rate)|(rate|prediction)s?[^.]*(at least|>=|≥|cannot go below|below|unde"
                    r"r) 1\b")
def ward_admissions_softplus_rate_into_log_input_poisson():
    return _admissions()


def _fact_admissions():
    _, y = ward_admissions(s=14)
    print(f"  mean admissions {y.mean():.2f}; smallest rate exp(softplus(z)) can give: exp(0) = 1")


fix("ward_admissions_softplus_rate_into_log_input_poisson", lambda: _admissions(True), poisson_deviance,
    "-val Poisson NLL (rate = output)", _fact_admissions)

# --------------------------------------------------------------------------- 5: sigmoid head into BCEWithLogits


def loan_table(n=4000, d=12, s=0):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, d, generator=g)
    p = torch.sigmoid(1.5 * x[:, 0] - x[:, 1] + 0.5 * x[:, 2] * x[:, 3])
    return x, (torch.rand(n, generator=g) < p).float()


class DefaultMLP(nn.Module):
    """Ported from Keras: Dense(1, activation='sigmoid'); the output is the default probability."""

    def __init__(self, d=12, sigmoid=True):
        super().__init__()
        layers = [nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 1)]
        self.net = nn.Sequential(*layers, nn.Sigmoid()) if sigmoid else nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x).squeeze(-1)


@torch.no_grad()
def val_log_loss(model, kw):
    x, y = kw["val_loader"].dataset.tensors
    out = model(x)
    p = out if isinstance(model.net[-1], nn.Sigmoid) else torch.sigmoid(out)
    return -F.binary_cross_entropy(p.clamp(1e-6, 1 - 1e-6), y).item()


def _loans(fix=False):
    seed(0)
    x, y = loan_table(s=15)
    model = DefaultMLP(sigmoid=not fix)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:3400], y[:3400]), 64),
                val_loader=loader(TensorDataset(x[3400:], y[3400:]), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=2000)


@case("loan_default_sigmoid_head_into_bce_with_logits", "targets",
      bug="the Keras port keeps the final nn.Sigmoid (Dense(1, activation='sigmoid')) and trains with "
          "BCEWithLogitsLoss, which applies a second sigmoid: the loss sees sigmoid(p) in (0.5, 0.73) for p in (0, 1), "
          "so it pushes every probability to exactly 0 or 1 and the model's outputs are not calibrated "
          "probabilities (drop the Sigmoid, or use BCELoss)",
      cause_pattern=r"sigmoid[^.]*(twice|double|already|again|BCEWithLogits|with.?logits|logits)|(double|two|second) "
                    r"sigmoids?|BCEWithLogits[^.]*(probabilit|sigmoid)|probabilit\w*[^.]*(as|into|treated as|instead of) "
                    r"logits|logits[^.]*(already|are) (probabilit|in \[?\(?0)|outputs? (lie |are )?in \[?\(?0, ?1")
def loan_default_sigmoid_head_into_bce_with_logits():
    return _loans()


def _fact_loans():
    print(f"  what the loss sees for outputs 0 and 1: sigmoid(0) = {torch.sigmoid(torch.tensor(0.)).item():.2f}, "
          f"sigmoid(1) = {torch.sigmoid(torch.tensor(1.)).item():.2f}")


fix("loan_default_sigmoid_head_into_bce_with_logits", lambda: _loans(True), val_log_loss,
    "-val log loss (output read as probability)", _fact_loans)

# --------------------------------------------------------------------------- 6: second head fitted to column 0


def bike_rentals(n=4000, d=10, s=0):
    """Hourly casual and registered rentals (standardised): driven by different features."""
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, d, generator=g)
    casual = torch.tanh(x[:, 0] + x[:, 1]) + 0.1 * torch.randn(n, generator=g)
    registered = torch.tanh(x[:, 2] - x[:, 3]) + 0.1 * torch.randn(n, generator=g)
    y = torch.stack([casual, registered], 1)
    return x, (y - y.mean(0)) / y.std(0)


class TwoHeadRegressor(nn.Module):
    def __init__(self, d=10):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d, 64), nn.ReLU())
        self.casual, self.registered = nn.Linear(64, 1), nn.Linear(64, 1)

    def forward(self, x):
        h = self.trunk(x)
        return torch.cat([self.casual(h), self.registered(h)], 1)


def two_task_mse_typo(model, batch):
    x, y = batch
    out = model(x)
    return F.mse_loss(out[:, 0], y[:, 0]) + F.mse_loss(out[:, 1], y[:, 0])


def two_task_mse(model, batch):
    x, y = batch
    out = model(x)
    return F.mse_loss(out[:, 0], y[:, 0]) + F.mse_loss(out[:, 1], y[:, 1])


@torch.no_grad()
def registered_mse(model, kw):
    x, y = kw["val_loader"].dataset.tensors
    return -F.mse_loss(model(x)[:, 1], y[:, 1]).item()


def _bikes(fix=False):
    seed(0)
    x, y = bike_rentals(s=16)
    model = TwoHeadRegressor()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:3400], y[:3400]), 64),
                val_loader=loader(TensorDataset(x[3400:], y[3400:]), 200, shuffle=False),
                loss_fn=two_task_mse if fix else two_task_mse_typo, max_steps=2000)


@case("bike_rentals_registered_head_fitted_to_casual_column", "targets",
      bug="the two-task loss is mse(out[:, 0], y[:, 0]) + mse(out[:, 1], y[:, 0]), a copy-paste slip: the "
          "'registered riders' head is fitted to the casual-riders column too, so both outputs learn the same "
          "target and target column 1 is never used (mse(out[:, 1], y[:, 1]))",
      cause_pattern=r"(heads?|outputs?|tasks?|columns?)[^.]*(same|identical|duplicat\w*) (targets?|labels?|column)|"
                    r"(same|identical) (targets?|labels?|column)[^.]*(heads?|outputs?|tasks?)|y\[:, ?0\]|copy.?paste|"
                    r"(second|other|registered) (target|label) column|(target|label) column[^.]*(unused|never used|"
                    r"ignored)|(outputs?|heads?) (0 and 1|1 and 0)[^.]*(same|identical|equal)")
def bike_rentals_registered_head_fitted_to_casual_column():
    return _bikes()


def _fact_bikes():
    _, y = bike_rentals(s=16)
    print(f"  correlation of the casual and registered columns: {torch.corrcoef(y.T)[0, 1]:.2f}")


fix("bike_rentals_registered_head_fitted_to_casual_column", lambda: _bikes(True), registered_mse,
    "-val MSE of the registered head", _fact_bikes)

# --------------------------------------------------------------------------- 7: CTC blank is digit 0

DIGITS, BLANK, FRAMES = 10, 10, 24


def digit_strips(n=3000, s=0):
    """Receipt digit strips as feature frames: each digit (0-9) is 3 frames of its pattern, gaps between."""
    g = torch.Generator().manual_seed(s)
    protos = torch.randn(DIGITS, 16, generator=g)
    x = 0.4 * torch.randn(n, FRAMES, 16, generator=g)
    labels = torch.randint(0, DIGITS, (n, 4), generator=g)
    lengths = torch.randint(2, 5, (n,), generator=g)
    for i in range(n):
        t = int(torch.randint(0, 3, (1,), generator=g))
        for k in range(lengths[i]):
            x[i, t:t + 3] += protos[labels[i, k]]
            t += 3 + int(torch.randint(1, 3, (1,), generator=g))
    labels[torch.arange(4)[None] >= lengths[:, None]] = 0
    return x, labels, lengths


class StripReader(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(16, 64, batch_first=True, bidirectional=True)
        self.out = nn.Linear(128, DIGITS + 1)     # 0-9, and the blank as the last class (10)

    def forward(self, x):
        return self.out(self.gru(x)[0]).log_softmax(-1)


def ctc_loss_fn(ctc):
    def loss(model, batch):
        x, labels, lengths = batch
        log_probs = model(x).transpose(0, 1)                  # (T, B, C)
        inputs = torch.full((x.size(0),), FRAMES, dtype=torch.long)
        return ctc(log_probs, labels, inputs, lengths)
    return loss


@torch.no_grad()
def strip_exact(model, kw):
    """Greedy decoding with the model's blank (class 10): fraction of strips read exactly."""
    x, labels, lengths = kw["val_loader"].dataset.tensors
    best = model(x).argmax(-1)
    right = 0
    for b in range(len(x)):
        seq, prev = [], None
        for c in best[b].tolist():
            if c != prev and c != BLANK:
                seq.append(c)
            prev = c
        right += seq == labels[b, :lengths[b]].tolist()
    return right / len(x)


def _strips(fix=False):
    seed(0)
    x, labels, lengths = digit_strips(s=17)
    model = StripReader()
    ctc = nn.CTCLoss(blank=BLANK, zero_infinity=True) if fix else nn.CTCLoss(zero_infinity=True)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2600], labels[:2600], lengths[:2600]), 32),
                val_loader=loader(TensorDataset(x[2600:], labels[2600:], lengths[2600:]), 100, shuffle=False),
                loss_fn=ctc_loss_fn(ctc), max_steps=3000)


@case("receipt_digits_ctc_blank_is_digit_zero", "targets",
      bug="the reader's last output class (10) is meant to be the CTC blank, but nn.CTCLoss() keeps its default "
          "blank=0, which is also the digit '0': every 0 in the targets is read as a blank, class 10 is never a "
          "target and the model is trained to emit '0' in the gaps, so decoded strips are wrong "
          "(nn.CTCLoss(blank=10))",
      cause_pattern=r"\bblank\b|blank_?(id|index|idx)|(class|index|id|label) 0[^.]*(reserved|digit|character|real)")
def receipt_digits_ctc_blank_is_digit_zero():
    return _strips()


def _fact_strips():
    _, labels, lengths = digit_strips(n=500, s=17)
    real = labels[torch.arange(4)[None] < lengths[:, None]]
    print(f"  nn.CTCLoss().blank = {nn.CTCLoss().blank}; share of target digits that are 0: "
          f"{(real == 0).float().mean():.2f}")


fix("receipt_digits_ctc_blank_is_digit_zero", lambda: _strips(True), strip_exact, "val strips read exactly",
    _fact_strips)
