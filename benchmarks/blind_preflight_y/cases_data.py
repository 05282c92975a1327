"""Data: the rows the loop trains on are not the rows the user meant (aliased buffers, overwritten transitions,
batches without positives, misaligned label columns, an inverted censoring flag)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

from benchmarks.blind_preflight_y.registry import (
    MDP,
    c_index_metric,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    model_device,
    q_rmse,
    seed,
    sync_every,
)


class GymLikeEnv:
    """A gym-style wrapper around an MDP that writes each observation into one preallocated array (as many
    simulators do) and returns that array from reset() and step()."""

    def __init__(self, mdp: MDP, s: int, fresh_arrays: bool = False):
        self.mdp, self.rng, self.fresh = mdp, np.random.default_rng(s), fresh_arrays
        self.obs = np.zeros(mdp.feat.shape[1], dtype=np.float32)
        self.state = 0

    def _emit(self):
        if self.fresh:
            return self.mdp.feat[self.state].copy()
        self.obs[:] = self.mdp.feat[self.state]
        return self.obs

    def reset(self):
        self.state = int(self.rng.choice(np.flatnonzero(~self.mdp.term)))
        return self._emit()

    def step(self, action):
        r = float(self.mdp.rew[self.state, action])
        self.state = int(self.mdp.nxt[self.state, action])
        done = bool(self.mdp.term[self.state])
        return self._emit(), r, done


def _to_dataset(buffer):
    obs, act, rew, nobs, done = zip(*buffer)
    return TensorDataset(torch.tensor(np.stack(obs)), torch.tensor(act), torch.tensor(rew, dtype=torch.float32),
                         torch.tensor(np.stack(nobs)), torch.tensor(done, dtype=torch.float32))


def _dqn_loss(gamma, period=10):
    refresh = sync_every(period)
    holder = {}

    def loss_fn(model, batch):
        obs, act, rew, nobs, done = batch
        if "target" not in holder:
            holder["target"] = nn.Sequential(nn.Linear(obs.shape[1], 64), nn.ReLU(), nn.Linear(64, model[-1].out_features))
        target = holder["target"].to(obs.device)
        if refresh():
            target.load_state_dict(model.state_dict())
        q_sa = model(obs).gather(1, act[:, None]).squeeze(1)
        with torch.no_grad():
            y = rew + gamma * target(nobs).max(1).values * (1.0 - done)
        return F.smooth_l1_loss(q_sa, y)
    return loss_fn


# ---------------------------------------------------------------------------------------------------------------
# A replay buffer for an HVAC controller: the env reuses one observation array and the loop stores it as is.
_HVAC = MDP(n_states=36, n_actions=3, n_feat=10, gamma=0.8, s=211)


def y_hvac_replay_buffer_aliases_obs(fixed: bool = False):
    seed(211)
    env = GymLikeEnv(_HVAC, s=211, fresh_arrays=fixed)  # fixed: the env returns np.copy(self.obs)
    rng = np.random.default_rng(212)
    buffer = []
    obs = env.reset()
    for step in range(3000):
        a = int(rng.integers(0, 3))
        next_obs, r, done = env.step(a)
        buffer.append((obs, a, r, next_obs, done))
        obs = env.reset() if done or step % 20 == 19 else next_obs  # 20-step episodes
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(_to_dataset(buffer), batch_size=64), val_loader=_HVAC.val_loader(),
                loss_fn=_dqn_loss(0.8), max_steps=5000)


case("y_hvac_replay_buffer_aliases_obs", "data",
     bug="The HVAC env returns its one preallocated observation array from reset() and step() and rewrites it in "
         "place, and the rollout appends that array itself to the replay buffer, so every stored state and next "
         "state is the same final observation (the env or the buffer needs np.copy).",
     cause_pattern=r"np\.copy|\.copy\(\)|copy\.deepcopy|clone\(\)|in.place|same (numpy )?(array|object|reference"
                   r"|buffer)|(reference|alias)\w*.{0,60}(observ|state|array|buffer)|(all|every) (stored |the )?"
                   r"(states?|observations?|obs).{0,40}(identical|the same|equal)|identical (states|observations)")(
    y_hvac_replay_buffer_aliases_obs)
fix("y_hvac_replay_buffer_aliases_obs", fixed_of(y_hvac_replay_buffer_aliases_obs), q_rmse, "Q RMSE vs Q*",
    higher=False, steps=600)


# ---------------------------------------------------------------------------------------------------------------
# A DQN for a drone-battery manager: "state = next_state" was moved above the buffer push.
_DRONE = MDP(n_states=36, n_actions=4, n_feat=10, gamma=0.8, s=221)


def y_drone_next_state_overwrites_state(fixed: bool = False):
    seed(221)
    env = GymLikeEnv(_DRONE, s=221, fresh_arrays=True)
    rng = np.random.default_rng(222)
    buffer = []
    state = env.reset()
    for step in range(3000):
        action = int(rng.integers(0, 4))
        next_state, reward, done = env.step(action)
        if fixed:
            buffer.append((state, action, reward, next_state, done))
            state = next_state
        else:
            state = next_state
            buffer.append((state, action, reward, next_state, done))
        if done or step % 20 == 19:  # 20-step episodes
            state = env.reset()
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(_to_dataset(buffer), batch_size=64), val_loader=_DRONE.val_loader(),
                loss_fn=_dqn_loss(0.8), max_steps=5000)


case("y_drone_next_state_overwrites_state", "data",
     bug="The loop sets state = next_state before pushing the transition, so every stored (state, action, reward, "
         "next_state, done) has state == next_state: the reward is credited to the state it leads to and each "
         "state bootstraps from itself.",
     cause_pattern=r"state ?== ?next_state|state ?= ?next_state|next_state.{0,60}(same as|equal|identical|==|"
                   r"overwrit\w*|before)|(overwrit|reassign)\w*.{0,40}(state|obs)|(push|append|stor)\w*.{0,60}"
                   r"(after|before).{0,40}(assign|updat)\w*|(states?|obs\w*) (and|equals?|==) (the )?next.?states?"
                   r".{0,30}(same|identical|equal)")(y_drone_next_state_overwrites_state)
fix("y_drone_next_state_overwrites_state", fixed_of(y_drone_next_state_overwrites_state), q_rmse, "Q RMSE vs Q*",
    higher=False, steps=600)


# ---------------------------------------------------------------------------------------------------------------
# Re-identification of wind-turbine blades from vibration signatures with batch-hard triplet mining.
def _blades(n_ids=200, per_id=8, s=231):
    g = gen(s)
    centers = torch.randn(n_ids, 32, generator=g)
    y = torch.arange(n_ids).repeat_interleave(per_id)
    x = centers[y] + 0.9 * torch.randn(len(y), 32, generator=g)
    train = torch.arange(len(y)) % per_id < 6
    return x[train], y[train], x[~train], y[~train]


class PKSampler(Sampler):
    """Batches of P identities x K samples each (what batch-hard mining needs)."""

    def __init__(self, labels, p, k, s):
        self.labels, self.p, self.k, self.s = labels, p, k, s
        self.epoch = 0

    def __iter__(self):
        g = torch.Generator().manual_seed(self.s + self.epoch)
        self.epoch += 1
        ids = torch.unique(self.labels)
        order = ids[torch.randperm(len(ids), generator=g)]
        for i in range(0, len(order) - self.p + 1, self.p):
            batch = []
            for c in order[i:i + self.p]:
                idx = torch.nonzero(self.labels == c).squeeze(1)
                batch += idx[torch.randperm(len(idx), generator=g)[: self.k]].tolist()
            yield batch

    def __len__(self):
        return len(torch.unique(self.labels)) // self.p


def batch_hard_triplet(emb, labels, margin=0.3):
    d = torch.cdist(emb, emb)
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    hardest_pos = (d * (same & ~eye)).max(1).values
    hardest_neg = d.masked_fill(same, float("inf")).min(1).values
    return F.relu(hardest_pos - hardest_neg + margin).mean()


class Embedder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward(self, x):
        return F.normalize(self.net(x), dim=1)


def y_blade_triplet_batches_without_positives(fixed: bool = False):
    seed(231)
    xt, yt, xv, yv = _blades()
    model = Embedder()
    data = TensorDataset(xt, yt)
    if fixed:
        train_loader = DataLoader(data, batch_sampler=PKSampler(yt, 8, 4, s=231))
    else:
        train_loader = loader(data, batch_size=32)

    def loss_fn(model, batch):
        xb, yb = batch
        return batch_hard_triplet(model(xb), yb)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3), train_loader=train_loader,
                val_loader=loader(TensorDataset(xv, yv), batch_size=400, shuffle=False), loss_fn=loss_fn,
                max_steps=3000)


@torch.no_grad()
def blade_retrieval(model, kw):
    was = model.training
    model.eval()
    dev = model_device(model)
    gx, gy = kw["train_loader"].dataset.tensors
    gallery = model(gx.to(dev))
    right = n = 0
    for xb, yb in kw["val_loader"]:
        nn_idx = torch.cdist(model(xb.to(dev)), gallery).argmin(1)
        right += (gy.to(dev)[nn_idx] == yb.to(dev)).sum().item()
        n += len(yb)
    model.train(was)
    return right / n


case("y_blade_triplet_batches_without_positives", "data",
     bug="Batches are drawn by plain shuffling from 200 blade identities with 6 samples each, so a batch of 32 rarely "
         "holds two samples of one identity: batch-hard triplet mining finds almost no positives and the loss mostly "
         "just pushes embeddings apart.",
     cause_pattern=r"(positive|anchor)s?.{0,80}(batch|sampler|mining)|(batch|sampler).{0,80}(positives?|\bpk\b"
                   r"|p ?x ?k|per (class|identity))|(two|2|several|multiple|k) (samples|images|instances|examples) "
                   r"(of|per|from) (the same|each|one) (class|identity|label)|mperclasssampler|pk.sampl"
                   r"|(classes|identities|labels) per batch|samples per (class|identity|label)")(
    y_blade_triplet_batches_without_positives)
fix("y_blade_triplet_batches_without_positives", fixed_of(y_blade_triplet_batches_without_positives),
    blade_retrieval, "val 1-NN re-identification accuracy")


# ---------------------------------------------------------------------------------------------------------------
# Multi-label coding of discharge summaries from two annotation exports, each binarised on its own.
_TAGS = ["anemia", "arrhythmia", "asthma", "copd", "diabetes", "gerd", "hypertension", "migraine"]


def _export(n, s, drop=None):
    g = gen(s)
    x = torch.randn(n * 2, 20, generator=g)
    w = torch.randn(20, len(_TAGS), generator=gen(241))
    score = x @ w
    tags = score > score.quantile(0.75, dim=1, keepdim=True)
    if drop is not None:  # this export's annotators never used the tag
        keep = ~tags[:, _TAGS.index(drop)]
        x, tags = x[keep][:n], tags[keep][:n]
    rows = [[_TAGS[j] for j in range(len(_TAGS)) if t[j]] for t in tags[:n]]
    return x[:n], rows


def binarize(rows, classes):
    out = torch.zeros(len(rows), len(classes))
    for i, r in enumerate(rows):
        for t in r:
            out[i, classes.index(t)] = 1.0
    return out


def y_discharge_tags_binarizer_per_export(fixed: bool = False):
    seed(241)
    xa, ra = _export(1000, 242)
    xb, rb = _export(1000, 243, drop="asthma")
    xv, rv = _export(500, 244)
    classes_a = sorted({t for r in ra for t in r})  # MultiLabelBinarizer().fit(export_a)
    classes_b = classes_a if fixed else sorted({t for r in rb for t in r})  # ... refit on export_b
    ya, yb = binarize(ra, classes_a), binarize(rb, classes_b)
    if yb.shape[1] < ya.shape[1]:  # "shapes must match" -> pad the missing column
        yb = F.pad(yb, (0, ya.shape[1] - yb.shape[1]))
    x = torch.cat([xa, xb])
    y = torch.cat([ya, yb])
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, len(_TAGS)))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), batch_size=64),
                val_loader=loader(TensorDataset(xv, binarize(rv, classes_a)), batch_size=250, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=2000)


def micro_f1(model, kw):
    tp = fp = fn_ = 0.0
    was = model.training
    model.eval()
    with torch.no_grad():
        for xb, yb in kw["val_loader"]:
            p = (model(xb.to(model_device(model))) > 0).float().cpu()
            tp += (p * yb).sum().item()
            fp += (p * (1 - yb)).sum().item()
            fn_ += ((1 - p) * yb).sum().item()
    model.train(was)
    return 2 * tp / max(2 * tp + fp + fn_, 1.0)


case("y_discharge_tags_binarizer_per_export", "data",
     bug="The two annotation exports are binarised with separately fitted label binarizers and the narrower one "
         "(no 'asthma' tag) is zero-padded on the right to fit, so from 'asthma' on its columns are shifted by one "
         "and half the training rows carry their tags in the wrong columns.",
     cause_pattern=r"(binari[sz]er|multilabelbinarizer|label (space|vocabulary|columns?|order)|classes_).{0,80}"
                   r"(separate\w*|each|both|differ\w*|mismatch\w*|shift\w*|refit\w*|fit)|(fit|fitted|refit)\w*"
                   r".{0,40}(separately|twice|per (file|source|export|split))|(columns?|labels?|tags?).{0,40}(shift"
                   r"\w*|misalign\w*|mismatch\w*|out of order)|(pad|padded|padding).{0,60}(column|label|tag)"
                   r"|(same|single|shared|one) (binari[sz]er|vocabulary|label order|class list)")(
    y_discharge_tags_binarizer_per_export)
fix("y_discharge_tags_binarizer_per_export", fixed_of(y_discharge_tags_binarizer_per_export), micro_f1,
    "val micro-F1")


# ---------------------------------------------------------------------------------------------------------------
# An exponential (constant-hazard) survival model on a CDISC ADaM ADTTE extract: CNSR used as the event flag.
def _adtte(n=2400, s=251):
    g = gen(s)
    x = torch.randn(n, 8, generator=g)
    log_h = 0.9 * x[:, 0] - 0.7 * x[:, 1] + 0.5 * x[:, 2]
    t_event = -torch.log(torch.rand(n, generator=g)) / torch.exp(log_h)
    t_cens = 2.0 * torch.rand(n, generator=g)
    aval = torch.minimum(t_event, t_cens)
    cnsr = (t_event > t_cens).float()  # ADaM: CNSR = 1 censored, 0 event
    return x, aval, cnsr, t_event


def y_adtte_cnsr_used_as_event(fixed: bool = False):
    seed(251)
    x, aval, cnsr, t_true = _adtte()
    event = 1.0 - cnsr if fixed else cnsr
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def loss_fn(model, batch):
        xb, tb, eb = batch
        log_h = model(xb).squeeze(1)
        return -(eb * log_h - torch.exp(log_h) * tb).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], aval[:2000], event[:2000]), batch_size=128),
                val_loader=loader(TensorDataset(x[2000:], t_true[2000:]), batch_size=400, shuffle=False),
                loss_fn=loss_fn, max_steps=2000)


case("y_adtte_cnsr_used_as_event", "data",
     bug="The ADaM CNSR column (1 = censored, 0 = event) is passed as the event indicator, so the exponential "
         "survival likelihood treats every censored subject as an event and every observed event as censored.",
     cause_pattern=r"cnsr|censor\w*.{0,60}(invert\w*|flip\w*|swap\w*|revers\w*|1 ?- ?|opposite|as (the |an )?event)"
                   r"|(event|status) (indicator|flag|column).{0,60}(invert\w*|flip\w*|swap\w*|revers\w*|1 ?- ?"
                   r"|opposite|censor\w*)|1 ?= ?censored")(y_adtte_cnsr_used_as_event)
fix("y_adtte_cnsr_used_as_event", fixed_of(y_adtte_cnsr_used_as_event), c_index_metric(), "C-index vs true times")

