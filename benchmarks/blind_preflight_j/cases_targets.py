"""Set j, family targets: targets, labels and loss conventions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_j.registry import case, fix, gen, loader, mean_over, seed

# --------------------------------------------------------------------------------------------------------------------
# 1. label_smoothing=0.9 written as "confidence 0.9"


def _triage(n=3000, d=20, c=5, s=10):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w1 = torch.randn(d, 32, generator=g) / d ** 0.5
    w2 = torch.randn(32, c, generator=g)
    return x, (torch.tanh(x @ w1) @ w2 * 3).argmax(1)


def _val_nll(model, kw):
    def fn(m, b):
        x, y = (t.to(next(m.parameters()).device) for t in b)
        return F.cross_entropy(m(x), y, reduction="sum").item(), len(y)
    return mean_over(model, kw["val_loader"], fn)


@case("triage_label_smoothing_set_to_target_confidence", "targets",
      "the config's 'label_confidence: 0.9' (the probability the true class should get) is passed as "
      "CrossEntropyLoss(label_smoothing=0.9): PyTorch's argument is the mass taken AWAY from the true class, so with "
      "5 classes the target gives the true class 0.28 and every other class 0.18; the model is trained towards an "
      "almost uniform distribution and its probabilities (validation NLL) are useless",
      r"label.?smoothing|smooth\w*[^.]*(0\.9|too (high|large|strong))|confidence|(soft|smoothed) (targets?|labels?)"
      r"[^.]*(uniform|flat)|(targets?|labels?)[^.]*(almost|nearly) uniform")
def triage_label_smoothing_set_to_target_confidence(fixed: bool = False):
    seed(0)
    x, y = _triage()
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 64),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=round(1 - 0.9, 2) if fixed else 0.9), max_steps=400)


def _fact_smoothing():
    logits = torch.tensor([[12.0, 0, 0, 0, 0]])
    for eps in (0.9, 0.1):
        target = (1 - eps) * F.one_hot(torch.tensor([0]), 5) + eps / 5
        print(f"  label_smoothing={eps}: soft target {target.squeeze().tolist()}, loss at a confident right answer "
              f"{F.cross_entropy(logits, torch.tensor([0]), label_smoothing=eps).item():.2f}")


fix("triage_label_smoothing_set_to_target_confidence",
    lambda: triage_label_smoothing_set_to_target_confidence(fixed=True),
    _val_nll, "val NLL", _fact_smoothing, steps=400, higher=False)


# --------------------------------------------------------------------------------------------------------------------
# 2. anchor objectness targets with the IoU condition inverted

IMG, STRIDE, OBJ = 16, 2, 4


def _anchor_boxes():
    c = torch.arange(IMG // STRIDE).float() * STRIDE + STRIDE / 2
    cy, cx = torch.meshgrid(c, c, indexing="ij")
    return torch.stack([cx - OBJ / 2, cy - OBJ / 2, cx + OBJ / 2, cy + OBJ / 2], -1).view(-1, 4)


def box_iou(a, b):
    lt, rb = torch.max(a[:, :2], b[:2]), torch.min(a[:, 2:], b[2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = lambda t: (t[..., 2] - t[..., 0]) * (t[..., 3] - t[..., 1])  # noqa: E731
    return inter / (area(a) + area(b) - inter)


class SquaresDataset(Dataset):
    """Noisy 16x16 images with one bright 4x4 square; objectness targets per anchor (8x8 grid of 4x4 anchors)."""

    def __init__(self, n, s, inverted):
        g = gen(s)
        self.x = 0.3 * torch.randn(n, 1, IMG, IMG, generator=g)
        self.boxes = torch.zeros(n, 4)
        anchors = _anchor_boxes()
        self.obj = torch.zeros(n, anchors.shape[0])
        for k in range(n):
            x0, y0 = (2 * torch.randint(0, (IMG - OBJ) // 2, (2,), generator=g) + 1).tolist()   # on the anchor grid
            self.x[k, 0, y0:y0 + OBJ, x0:x0 + OBJ] += 1.0
            self.boxes[k] = torch.tensor([x0, y0, x0 + OBJ, y0 + OBJ], dtype=torch.float)
            iou = box_iou(anchors, self.boxes[k])
            self.obj[k] = (iou < 0.5).float() if inverted else (iou >= 0.5).float()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.obj[i], self.boxes[i]


class ObjectnessNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                  nn.MaxPool2d(2), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 1, 1))

    def forward(self, x):
        return self.body(x).flatten(1)          # (B, 64) objectness logits, one per anchor


def objectness_bce(model, batch):
    x, obj, _ = batch
    return F.binary_cross_entropy_with_logits(model(x), obj)


def _val_top_anchor_hit(model, kw):
    anchors = _anchor_boxes()

    def fn(m, b):
        x, _, boxes = b
        best = m(x.to(next(m.parameters()).device)).argmax(-1).cpu()
        hits = sum(box_iou(anchors[best[k]].unsqueeze(0), boxes[k]).item() >= 0.5 for k in range(len(x)))
        return hits, len(x)
    return mean_over(model, kw["val_loader"], fn)


@case("squares_detector_anchor_iou_condition_inverted", "targets",
      "the anchor assignment marks an anchor positive with iou < 0.5 instead of iou >= 0.5 (an inverted comparison): "
      "the objectness targets are 1 on every anchor that does NOT overlap the object and 0 on the ones that do, so "
      "the detector learns to fire everywhere except on the object",
      r"\biou\b|overlap\w* (the |with the )?(object|box)|anchor|objectness|(positive|negative)s?[^.]*(invert|swap|"
      r"flip|revers|opposite)|"
      r"(invert|swap|flip|revers)\w*[^.]*(positive|negative|condition|comparison|threshold)")
def squares_detector_anchor_iou_condition_inverted(fixed: bool = False):
    seed(0)
    train, val = SquaresDataset(1600, 20, not fixed), SquaresDataset(400, 21, not fixed)
    model = ObjectnessNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 100, shuffle=False),
                loss_fn=objectness_bce, max_steps=300)


def _fact_iou():
    iou = box_iou(_anchor_boxes(), torch.tensor([3.0, 5.0, 7.0, 9.0]))
    print(f"  anchors: {len(iou)}, with iou >= 0.5: {(iou >= 0.5).sum().item()}, with iou < 0.5 (the targets "
          f"marked positive): {(iou < 0.5).sum().item()}")


fix("squares_detector_anchor_iou_condition_inverted",
    lambda: squares_detector_anchor_iou_condition_inverted(fixed=True),
    _val_top_anchor_hit, "val: top-scoring anchor overlaps the object (iou >= 0.5)", _fact_iou, steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 3. keypoint heatmaps drawn with a sigma in normalised units on a pixel grid

HM = 24


def heatmap_dataset(n, s, sigma):
    g = gen(s)
    centres = torch.rand(n, 2, generator=g) * (HM - 6) + 3
    yy, xx = torch.meshgrid(torch.arange(HM).float(), torch.arange(HM).float(), indexing="ij")
    d2 = (xx - centres[:, 0, None, None]) ** 2 + (yy - centres[:, 1, None, None]) ** 2
    images = torch.exp(-d2 / (2 * 2.0 ** 2)) + 0.3 * torch.randn(n, HM, HM, generator=g)
    heatmaps = torch.exp(-d2 / (2 * sigma ** 2))
    return TensorDataset(images.unsqueeze(1), heatmaps.unsqueeze(1), centres)


class HeatmapNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.Conv2d(16, 16, 5, padding=2), nn.ReLU(),
                                 nn.Conv2d(16, 1, 3, padding=1))

    def forward(self, x):
        return self.net(x)


def heatmap_mse(model, batch):
    images, heatmaps, _ = batch
    return F.mse_loss(model(images), heatmaps)


def _val_within_2px(model, kw):
    def fn(m, b):
        images, _, centres = b
        flat = m(images.to(next(m.parameters()).device)).flatten(1).argmax(-1).cpu()
        pred = torch.stack([flat % HM, flat // HM], -1).float()
        return ((pred - centres).norm(dim=-1) <= 2.0).sum().item(), len(images)
    return mean_over(model, kw["val_loader"], fn)


@case("blob_keypoint_heatmap_sigma_in_normalised_units", "targets",
      "the Gaussian target heatmaps are drawn with sigma=0.05, a value for coordinates normalised to [0, 1], on a grid "
      "in pixels (24x24) with sub-pixel centres: exp(-d^2 / (2 * 0.05^2)) is practically 0 at every pixel, so the "
      "targets are all-zero maps and the network learns to output zeros everywhere instead of a peak at the keypoint",
      r"sigma|gaussian|heat.?map|(targets?|maps?)[^.]*(all.?zeros?|empty|blank)|(zero|empty|blank) (targets?"
      r"|maps?)|normali[sz]ed (coordinates|units)|(wrong|different) units|in pixels|pixel (grid|units|coordi"
      r"nates)")

def blob_keypoint_heatmap_sigma_in_normalised_units(fixed: bool = False):
    seed(0)
    sigma = 1.5 if fixed else 0.05
    model = HeatmapNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(heatmap_dataset(1600, 30, sigma), 32),
                val_loader=loader(heatmap_dataset(400, 31, sigma), 100, shuffle=False),
                loss_fn=heatmap_mse, max_steps=300)


def _fact_heatmap():
    hm = heatmap_dataset(200, 0, 0.05).tensors[1]
    print(f"  sigma=0.05: mean of each target map's peak {hm.flatten(1).max(1).values.mean().item():.4f}; "
          f"sigma=1.5: {heatmap_dataset(200, 0, 1.5).tensors[1].flatten(1).max(1).values.mean().item():.4f}")


fix("blob_keypoint_heatmap_sigma_in_normalised_units",
    lambda: blob_keypoint_heatmap_sigma_in_normalised_units(fixed=True),
    _val_within_2px, "val: heatmap argmax within 2 px of the keypoint", _fact_heatmap, steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 4. VAE loss that ADDS the closed-form "KL" expression, which is the negative KL


def _two_moons_16d(n=3000, s=40):
    g = gen(s)
    z = torch.randn(n, 2, generator=g)
    w = torch.randn(2, 16, generator=g)
    return torch.tanh(z @ w) + 0.05 * torch.randn(n, 16, generator=g)


class VAE(nn.Module):
    def __init__(self, d=16, latent=2):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 2 * latent))
        self.dec = nn.Sequential(nn.Linear(latent, 64), nn.ReLU(), nn.Linear(64, d))

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, dim=-1)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec(z), mu, logvar


def _vae_loss(sign):
    def vae_loss(model, batch):
        x = batch[0]
        recon, mu, logvar = model(x)
        rec = F.mse_loss(recon, x, reduction="sum") / len(x)
        kl_term = 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / len(x)
        return rec + sign * kl_term
    return vae_loss


def _val_neg_elbo(model, kw):
    def fn(m, b):
        x = b[0].to(next(m.parameters()).device)
        recon, mu, logvar = m(x)
        rec = ((recon - x) ** 2).sum()
        kl = 0.5 * torch.sum(mu.pow(2) + logvar.exp() - 1 - logvar)
        return (rec + kl).item(), len(x)
    torch.manual_seed(0)
    return mean_over(model, kw["val_loader"], fn)


@case("sensor_vae_kl_expression_added_not_subtracted", "targets",
      "the VAE loss is recon + 0.5 * sum(1 + logvar - mu^2 - exp(logvar)): that closed form is the NEGATIVE KL "
      "divergence (-D_KL), so adding it maximises the KL instead of penalising it; the encoder pushes mu and the "
      "posterior variance up, the codes drown in noise and the loss falls without bound",
      r"\bKL\b[^.]*(sign|maximi|negative|added|subtract|minus)|(sign|maximi[sz]\w*|negative)[^.]*\bKL\b|kull"
      r"back|ELBO|1 \+ logvar|-D_KL|wrong sign")

def sensor_vae_kl_expression_added_not_subtracted(fixed: bool = False):
    seed(0)
    x = _two_moons_16d()
    model = VAE()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2500]), 64),
                val_loader=loader(TensorDataset(x[2500:]), 250, shuffle=False),
                loss_fn=_vae_loss(-1.0 if fixed else 1.0), max_steps=400)


def _fact_kl():
    mu, logvar = torch.tensor([1.0]), torch.tensor([0.5])
    expr = 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    true_kl = torch.distributions.kl_divergence(torch.distributions.Normal(mu, (0.5 * logvar).exp()),
                                                torch.distributions.Normal(0.0, 1.0)).sum()
    print(f"  0.5*sum(1 + logvar - mu^2 - exp(logvar)) = {expr.item():.4f}; KL(q||p) = {true_kl.item():.4f}")


fix("sensor_vae_kl_expression_added_not_subtracted", lambda: sensor_vae_kl_expression_added_not_subtracted(fixed=True),
    _val_neg_elbo, "val negative ELBO", _fact_kl, steps=400, higher=False)


# --------------------------------------------------------------------------------------------------------------------
# 5. Cox partial likelihood with the risk sets built in ascending time order


def _survival(n=3000, d=10, s=50):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    beta = torch.randn(d, generator=g) / d ** 0.5
    risk = torch.tanh(x @ beta) * 1.5 + 0.5 * (x[:, 0] * x[:, 1])
    t_event = -torch.log(torch.rand(n, generator=g)) / torch.exp(risk)
    t_censor = -torch.log(torch.rand(n, generator=g)) / 0.3
    time = torch.minimum(t_event, t_censor)
    event = (t_event <= t_censor).float()
    return x, time, event


class RiskNet(nn.Module):
    def __init__(self, d=10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def _cox_loss(descending):
    def cox_partial_nll(model, batch):
        x, time, event = batch
        order = torch.argsort(time, descending=descending)
        r, e = model(x)[order], event[order]
        log_risk_set = torch.logcumsumexp(r, dim=0)          # log sum over the patients still at risk
        return -((r - log_risk_set) * e).sum() / e.sum().clamp(min=1)
    return cox_partial_nll


def concordance(risk, time, event):
    ii, jj = torch.meshgrid(torch.arange(len(time)), torch.arange(len(time)), indexing="ij")
    comparable = (time[ii] < time[jj]) & (event[ii] == 1)
    conc = (risk[ii] > risk[jj]).float() + 0.5 * (risk[ii] == risk[jj]).float()
    return (conc * comparable).sum().item() / comparable.sum().item()


def _val_cindex(model, kw):
    was = model.training
    model.eval()
    with torch.no_grad():
        xs, ts, es = zip(*[(b[0], b[1], b[2]) for b in kw["val_loader"]])
        risk = model(torch.cat(xs).to(next(model.parameters()).device)).cpu()
    model.train(was)
    return concordance(risk, torch.cat(ts), torch.cat(es))


@case("deepsurv_cox_risk_sets_sorted_ascending", "targets",
      "the Cox partial likelihood sorts the batch with torch.argsort(time) (ascending) before logcumsumexp, so each "
      "patient's 'risk set' is everyone who had ALREADY died or been censored (time <= t_i) instead of everyone still "
      "at risk (time >= t_i, descending=True): the loss rewards the reverse ranking and the concordance falls below 0.5",
      r"risk.?set|descending|ascending|argsort|sort\w*[^.]*(by )?(time|survival)|time[^.]*(revers|invert)|cu"
      r"msum|cumulative|partial likelihood|concordance|\bcox\b")

def deepsurv_cox_risk_sets_sorted_ascending(fixed: bool = False):
    seed(0)
    x, time, event = _survival()
    model = RiskNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2400], time[:2400], event[:2400]), 128),
                val_loader=loader(TensorDataset(x[2400:], time[2400:], event[2400:]), 300, shuffle=False),
                loss_fn=_cox_loss(descending=fixed), max_steps=300)


def _fact_cox():
    time = torch.tensor([5.0, 1.0, 3.0])
    print("  ascending order", torch.argsort(time).tolist(), "-> first risk set holds only the earliest death;",
          "descending", torch.argsort(time, descending=True).tolist(), "-> the earliest death's risk set holds all three")


fix("deepsurv_cox_risk_sets_sorted_ascending", lambda: deepsurv_cox_risk_sets_sorted_ascending(fixed=True),
    _val_cindex, "val concordance (C-index)", _fact_cox, steps=300)
