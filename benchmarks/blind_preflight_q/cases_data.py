"""Set q, family "data": what the loaders deliver is not what the user built them to deliver."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_q.registry import broken, loader, rng, seed

# ---------------------------------------------------------------------------------------------------------------
# 1. Pupil-centre localisation: a random horizontal flip applied to the image but not to the keypoint.


def eye_crops(n: int, s: int, size: int = 24):
    """Infrared eye crops (n, 1, 24, 24) with a dark pupil; targets (x, y) of its centre, normalized to [0, 1]."""
    g = rng(s)
    yy, xx = np.mgrid[:size, :size]
    imgs = g.normal(0.6, 0.08, size=(n, 1, size, size)).astype(np.float32)
    pts = g.uniform(4, size - 5, size=(n, 2))
    for i in range(n):
        imgs[i, 0] -= 0.5 * np.exp(-((xx - pts[i, 0]) ** 2 + (yy - pts[i, 1]) ** 2) / (2 * 2.0 ** 2))
    return torch.from_numpy(imgs), torch.tensor(pts / (size - 1), dtype=torch.float32)


class EyeLandmarks(Dataset):
    def __init__(self, imgs, pts, train: bool, flip_keypoint: bool):
        self.imgs, self.pts, self.train, self.flip_keypoint = imgs, pts, train, flip_keypoint

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        img, pt = self.imgs[i], self.pts[i].clone()
        if self.train and torch.rand(()) < 0.5:  # RandomHorizontalFlip(p=0.5)
            img = torch.flip(img, dims=[-1])
            if self.flip_keypoint:
                pt[0] = 1.0 - pt[0]
        return img, pt


class PupilNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.regressor = nn.Sequential(nn.Linear(32 * 6 * 6, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, x):
        return self.regressor(self.features(x))


@broken("pupil_flip_keypoint_not_mirrored", "data",
        "The training Dataset flips each eye crop left-right with p=0.5 but returns the (x, y) pupil keypoint "
        "unchanged, so for half of the samples the x target points to the mirrored side; x must become 1 - x when "
        "the image is flipped.",
        "if flipped: pt[0] = 1.0 - pt[0]",
        "https://blog.roboflow.com/how-flip-augmentation-improves-model-performance/",
        r"(flip|mirror)\w*.{0,120}(keypoint|landmark|target|label|coordinate|annotation|point)s?.{0,80}(not|unchanged|"
        r"without|never|isn't|aren't|same)|(keypoint|landmark|target|coordinate|annotation|point)s? .{0,80}(not|never) "
        r"(flipped|mirrored|transformed|updated|adjusted)|1 ?- ?x\b|(augment\w*|transform\w*|flip\w*) (is |are )?"
        r"(applied )?(only )?to (the )?(images?|inputs?) (but )?not (to )?(the )?(targets?|keypoints?|labels?|"
        r"coordinates?)")
def pupil_flip_keypoint_not_mirrored(fixed: bool = False):
    seed(40)
    imgs, pts = eye_crops(1600, 211)
    train = EyeLandmarks(imgs[:1200], pts[:1200], train=True, flip_keypoint=fixed)
    val = EyeLandmarks(imgs[1200:], pts[1200:], train=False, flip_keypoint=fixed)
    model = PupilNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 200, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 2. Machine-state diagnosis: a label-sorted export split by taking its last 20 % as validation.

STATE_COUNTS = (600, 550, 450, 400)  # normal, imbalance, misalignment, bearing fault


def vibration_features(counts, s: int):
    """12 spectral features per recording for 4 machine states, exported sorted by state."""
    g = rng(s)
    means = rng(221).normal(0, 1.2, size=(4, 12))
    labels = np.concatenate([np.full(c, k) for k, c in enumerate(counts)])
    x = means[labels] + g.normal(size=(len(labels), 12))
    return torch.tensor(x, dtype=torch.float32), torch.from_numpy(labels)


def machine_test_set():
    return [vibration_features((250, 250, 250, 250), 229)]


@broken("fault_sorted_tail_validation", "data",
        "The recordings come sorted by machine state and the validation set is the last 20 % (X[-n_val:]) taken "
        "without shuffling first: validation holds only bearing faults and the training set contains none, so the "
        "model never learns that class.",
        "perm = np.random.permutation(len(X)); X, y = X[perm], y[perm]  # before slicing off the validation rows",
        "https://rocuku.github.io/keras-validation-split-shuffle/",
        r"(sorted|ordered|grouped) (by )?(label|class|state|target).{0,120}(split|slic|last|tail|validation)|(split|"
        r"slic\w*|last \d+ ?%|tail) .{0,80}(without|before) (shuffl|permut)|(class|label|state)\w* .{0,60}(absent|"
        r"missing|never seen|not present|unseen|does not appear) (from|in) (the )?train|(train\w*|training set) "
        r".{0,60}(lacks|has no|contains no|never sees|is missing) .{0,40}(class|label|state)|validation (set )?"
        r"(holds|contains|is|has) only (one|a single|class)|(class|label|state)\w*.{0,40}(appears?|occurs?|present|"
        r"exists?) only in (the )?(validation|val\b)")
def fault_sorted_tail_validation(fixed: bool = False):
    seed(41)
    x, y = vibration_features(STATE_COUNTS, 223)
    if fixed:
        perm = rng(7).permutation(len(x))
        x, y = x[perm], y[perm]
    n_val = int(0.2 * len(x))
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:-n_val], y[:-n_val]), 64),
                val_loader=loader(TensorDataset(x[-n_val:], y[-n_val:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=250)


# ---------------------------------------------------------------------------------------------------------------
# 3. Behaviour cloning for a point robot: the simulator returns a view of its state buffer, stored by reference.


class PointRobotSim:
    """A 2-D point robot; observe() returns the internal state array (position, goal, velocity), which step()
    updates in place (as some simulators do)."""

    def __init__(self, s: int):
        self.g = rng(s)
        self._obs = np.zeros(6, np.float32)
        self.reset()

    def reset(self):
        self._obs[:4] = self.g.uniform(-1, 1, size=4)
        self._obs[4:] = 0.0

    def observe(self):
        return self._obs

    def step(self, action: int):
        dv = np.array([[0.1, 0], [-0.1, 0], [0, 0.1], [0, -0.1]], np.float32)[action]
        self._obs[4:] = 0.5 * self._obs[4:] + dv
        self._obs[:2] = np.clip(self._obs[:2] + self._obs[4:], -1, 1)


def expert_action(obs) -> int:
    d = obs[2:4] - obs[:2]
    return (0 if d[0] > 0 else 1) if abs(d[0]) >= abs(d[1]) else (2 if d[1] > 0 else 3)


def collect_demos(episodes: int, s: int, copy_obs: bool):
    sim, g = PointRobotSim(s), rng(s + 1)
    observations, actions = [], []
    for _ in range(episodes):
        sim.reset()
        for _ in range(12):
            obs = sim.observe()
            act = expert_action(obs)
            observations.append(obs.copy() if copy_obs else obs)
            actions.append(act)
            sim.step(act if g.random() > 0.3 else int(g.integers(0, 4)))
    return torch.tensor(np.stack(observations)), torch.tensor(actions)


def robot_test_set():
    return [collect_demos(60, 239, copy_obs=True)]


@broken("robot_demo_obs_aliasing", "data",
        "The simulator's observe() returns its internal state array, which step() mutates in place, and the "
        "demonstration loop appends that same array object every step: after collection every stored observation "
        "is the final state, so the policy sees one identical input paired with all the expert actions.",
        "observations.append(sim.observe().copy())",
        "https://github.com/google-deepmind/dm_control/issues/34",
        r"alias|same (numpy )?(array|buffer|object|ndarray)|in[- ]place|\bmutat(ed|es|ing|ion)|by reference|\.copy\(\)|(copy|copies) "
        r"of (the )?(observation|state|array)|(all|every) (stored |collected |training )?(observations|inputs|states|"
        r"feature rows|input rows|rows) (are |is )?(identical|the same)|identical (observations|inputs|states|feature "
        r"rows|input rows)")
def robot_demo_obs_aliasing(fixed: bool = False):
    seed(42)
    x, y = collect_demos(200, 231, copy_obs=fixed)
    xv, yv = collect_demos(50, 233, copy_obs=fixed)
    model = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 300,
                                                                                 shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 4. Hourly electricity load: rows shuffled before the sliding windows are cut.


def hourly_load(hours: int, s: int):
    g = rng(s)
    t = np.arange(hours)
    noise = np.zeros(hours)
    for i in range(1, hours):
        noise[i] = 0.8 * noise[i - 1] + 0.2 * g.normal()
    load = np.sin(2 * np.pi * t / 24) + 0.4 * np.sin(2 * np.pi * t / 168) + noise
    return ((load - load.mean()) / load.std()).astype(np.float32)


def make_windows(series: np.ndarray, lookback: int = 24):
    idx = np.arange(len(series) - lookback)[:, None] + np.arange(lookback + 1)[None, :]
    w = series[idx]
    return torch.from_numpy(w[:, :lookback]), torch.from_numpy(w[:, lookback:])


def load_test_set():
    return [make_windows(hourly_load(1000, 249))]


@broken("load_rows_shuffled_before_windowing", "data",
        "The hourly load rows are shuffled (series[rng.permutation(n)], 'to avoid order bias') before the sliding "
        "windows are cut, so each window is 24 random hours and its next-hour target is unrelated to it; windows "
        "must be cut from the ordered series and only the windows shuffled.",
        "X, y = make_windows(series)  # cut windows from the ordered series; the DataLoader shuffles the windows",
        "https://community.deeplearning.ai/t/shuffle-in-time-series/384140",
        r"shuffl\w* (the )?(rows|series|time[- ]series|hours|timesteps|time steps|raw data|readings|samples|data|"
        r"observations) before (building|creating|cutting|making|windowing|the (sliding )?windows)|(temporal|time|"
        r"chronological) order (is |was )?(destroyed|lost|broken|scrambled)|windows? (are|is|were|was) (built|cut|"
        r"made|created) (from|on) (a )?(shuffled|permuted)|permut\w*.{0,60}before .{0,30}window|(rows|series|hours|"
        r"readings|data|time steps|timesteps) (are |were |is |was )?(shuffled|permuted).{0,80}before .{0,30}window|(consecutive|"
        r"contiguous|adjacent) (hours|values|rows|time ?steps) .{0,60}(not|no longer)")
def load_rows_shuffled_before_windowing(fixed: bool = False):
    seed(43)
    series = hourly_load(4000, 241)
    if not fixed:
        series = series[rng(3).permutation(len(series))]
    x, y = make_windows(series)
    n_train = int(0.8 * len(x))
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:n_train], y[:n_train]), 64),
                val_loader=loader(TensorDataset(x[n_train:], y[n_train:]), 400, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 5. 30-day readmission: rows with missing labs dropped from X only, y cut to len(X).


def admissions(n: int, s: int, missing: float = 0.12):
    """6 lab values per admission (some missing as NaN) and the 30-day readmission label."""
    g = rng(s)
    w = rng(251).normal(size=6)
    x = g.normal(size=(n, 6)).astype(np.float32)
    y = ((x @ w + 0.3 * g.normal(size=n)) > 0).astype(np.int64)
    holes = g.random(n) < missing
    x[holes, g.integers(0, 6, size=holes.sum())] = np.nan
    return x, y


def clean_admissions(x: np.ndarray, y: np.ndarray, fixed: bool):
    complete = ~np.isnan(x).any(axis=1)
    x = x[complete]
    # TensorDataset raised "Size mismatch between tensors", so y is cut to the same length
    y = y[complete] if fixed else y[:len(x)]
    return torch.from_numpy(x), torch.from_numpy(y)


def readmission_test_set():
    x, y = admissions(1000, 259, missing=0.0)
    return [(torch.from_numpy(x), torch.from_numpy(y))]


@broken("readmission_dropna_features_only", "data",
        "Admissions with a missing lab value are dropped from X only and y is then cut to len(X) to silence the "
        "TensorDataset size mismatch, so from the first dropped row on every label belongs to a different admission.",
        "y = y[complete]  # drop the same rows from the labels",
        "https://codereviewbot.ai/code-review-tool/UgTijeU4/addressing-data-alignment-and-leakage-issues-in-linear-"
        "regression-model",
        r"misalign|(labels?|targets?|\by\b) (are |is )?(shifted|offset|out of (sync|step|alignment|order)|belong to "
        r"(a )?different|no longer (match|line up|correspond))|dropp?\w* .{0,60}(from )?(the )?(features|x|inputs) "
        r"only|(dropped|removed|filtered) (rows )?(from|in) (the )?(features|x|inputs) (but )?not (from|in) (the )?"
        r"(labels|targets|y)|y\[(mask|complete|keep)\]|y\[:len\(x\)\]|truncat\w* (the )?(labels|targets|y\b)")
def readmission_dropna_features_only(fixed: bool = False):
    seed(44)
    x, y = admissions(3000, 253)
    xv, yv = admissions(800, 255)
    x, y = clean_admissions(x, y, fixed)
    xv, yv = clean_admissions(xv, yv, fixed)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 400,
                                                                                shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)
