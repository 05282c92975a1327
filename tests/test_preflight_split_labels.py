"""data.split_labels: validation label ids that name other classes than in training (an
encoding built per split), found by nearest-neighbour label agreement, label shift and identical
inputs with conflicting labels; a consistent
encoding stays quiet, with a class missing from validation and under a covariate shift."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.split_labels import SplitLabelsCheck, relabelling

NAMES = ["account", "billing", "bug", "feature_request"]


def tickets(n: int, seed: int, classes: list[int]) -> tuple[torch.Tensor, list[str]]:
    """Ticket embeddings around one centre per class (noisy: neighbours agree ~80%)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)) * 1.2
    y = torch.tensor(classes)[torch.randint(0, len(classes), (n,), generator=g)]
    return centres[y] + torch.randn(n, 16, generator=g), [NAMES[i] for i in y.tolist()]


def encode(names: list[str], classes: list[str]) -> torch.Tensor:
    return torch.tensor([classes.index(name) for name in names])


def verdict(per_split: bool, shift: float = 0.0) -> tuple[list, dict]:
    train_x, train_names = tickets(2000, 1, [0, 1, 2, 3])
    val_x, val_names = tickets(400, 2, [1, 2, 3])  # the validation month has no account tickets
    val_x = val_x + shift
    train_y = encode(train_names, sorted(set(train_names)))
    val_y = encode(val_names, sorted(set(val_names)) if per_split else sorted(set(train_names)))
    model = nn.Linear(16, 4)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(train_x, train_y), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset(val_x, val_y), batch_size=128),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    result = report.check("data.split_labels")
    return [i for i in result.issues if i.code == "VAL_LABEL_MAPPING"], result.data


def test_labels_encoded_per_split_are_found_with_their_relabelling():
    issues, data = verdict(per_split=True)
    assert issues, data
    assert "0 -> 1, 1 -> 2, 2 -> 3" in issues[0].message
    assert "LabelEncoder().fit(train_labels)" in issues[0].fix
    assert data["val_agreement"] < 0.3 < data["train_agreement"]


def test_one_encoding_for_both_splits_is_quiet_with_a_class_missing_from_validation():
    issues, data = verdict(per_split=False)
    assert not issues
    assert abs(data["val_agreement"] - data["train_agreement"]) < 0.1


def test_a_covariate_shift_lowers_the_agreement_without_a_relabelling_and_is_quiet():
    issues, data = verdict(per_split=False, shift=1.5)
    assert not issues
    assert data["val_agreement"] < data["train_agreement"]


def test_features_that_say_nothing_about_the_labels_are_no_evidence():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1000, 8, generator=g), torch.randint(0, 3, (1000,), generator=g)
    found = relabelling(x, y, torch.randn(200, 8, generator=g), (torch.randint(0, 3, (200,), generator=g) + 1) % 3)
    assert found is not None and not found.relabelled


def shift_verdict(split: str, sampler: bool = False) -> list:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (2500, 12), generator=g)  # token ids: no float features to compare
    y = torch.multinomial(torch.tensor([0.5, 0.3, 0.2]), 2500, replacement=True, generator=g)
    if split == "sorted":
        order = y.argsort(stable=True)  # an export sorted by label, its last rows held out
        ids, y = ids[order], y[order]
    train, val = TensorDataset(ids[:2000], y[:2000]), TensorDataset(ids[2000:], y[2000:])
    if sampler:
        weights = (1.0 / torch.bincount(y[:2000]).float())[y[:2000]]
        loader = DataLoader(train, batch_size=64, sampler=torch.utils.data.WeightedRandomSampler(weights, 2000))
    else:
        loader = DataLoader(train, batch_size=64, shuffle=True)
    model = nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(96, 3))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader,
                           val_loader=DataLoader(val, batch_size=128), loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), SplitLabelsCheck()])
    return [i for i in report.check("data.split_labels").issues if i.code == "VAL_LABEL_SHIFT"]


def test_a_semi_supervised_split_whose_unlabelled_rows_are_ignored_is_no_shift():
    # 97% of the training rows carry -100 (ignored), validation is fully labelled: the labelled
    # rows share one distribution, and an ignored target is no class.
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (3000, 12), generator=g)
    y = torch.randint(0, 5, (3000,), generator=g)
    train_y = torch.where(torch.rand(3000, generator=g) < 0.03, y, torch.full_like(y, -100))[:2400]
    model = nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(96, 5))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids[:2400], train_y), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset(ids[2400:], y[2400:]), batch_size=128),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    assert not [i for i in report.check("data.split_labels").issues if i.code == "VAL_LABEL_SHIFT"]


def test_a_validation_split_cut_from_a_label_sorted_export_fires():
    found = shift_verdict("sorted")
    assert found and "stratify" in found[0].fix and "validation 2: 99%" in found[0].message


@pytest.mark.parametrize("sampler", [False, True], ids=["shuffled_split", "balancing_sampler"])
def test_a_random_split_and_a_balancing_sampler_are_quiet(sampler):
    assert not shift_verdict("random", sampler)


def conflict_verdict(drop_negations: bool) -> list:
    g = torch.Generator().manual_seed(0)
    words = torch.randint(3, 40, (2000, 6), generator=g)
    negated = torch.rand(2000, generator=g) < 0.4
    y = (words[:, 0] % 2 == 0).long() ^ negated.long()  # "not" flips the sentiment
    ids = torch.cat([torch.where(negated, 2, 1)[:, None], words], 1)  # token 2 = "not", 1 = no negation
    if drop_negations:
        ids[:, 0] = 1  # the stop-word list removed "not"
    ids = ids[:, :3]  # short reviews: few distinct texts, so identical inputs recur
    model = nn.Sequential(nn.Embedding(40, 8), nn.Flatten(), nn.Linear(24, 2))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids, y), batch_size=64, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    return [i for i in report.check("data.split_labels").issues if i.code == "LABEL_CONFLICT"]


def test_identical_inputs_with_opposite_labels_fire_and_informative_inputs_stay_quiet():
    found = conflict_verdict(drop_negations=True)
    assert found and "negations" in found[0].message
    assert not conflict_verdict(drop_negations=False)


class PairwiseFactorization(nn.Module):
    def __init__(self):
        super().__init__()
        self.user, self.item = nn.Embedding(80, 8), nn.Embedding(120, 8)

    def score(self, users, items):
        return (self.user(users) * self.item(items)).sum(-1)


def bpr_loss(model, batch):
    users, clicked, sampled = batch
    return -F.logsigmoid(model.score(users, clicked) - model.score(users, sampled)).mean()


def test_a_sampled_negative_beside_user_and_item_ids_is_no_label_conflict():
    # (user, clicked item, random unclicked item): the same pair recurs with other negatives by design.
    g = torch.Generator().manual_seed(0)
    users = torch.randint(0, 80, (6000,), generator=g)
    clicked, sampled = torch.randint(0, 20, (6000,), generator=g), torch.randint(20, 120, (6000,), generator=g)
    model = PairwiseFactorization()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(users, clicked, sampled), batch_size=64, shuffle=True),
                           loss_fn=bpr_loss, checks=[FirstBatchCheck(), SplitLabelsCheck()])
    assert not [i for i in report.check("data.split_labels").issues if i.code == "LABEL_CONFLICT"]


def test_folder_names_sorted_as_strings_in_one_split_are_named():
    g = torch.Generator().manual_seed(4)
    centres = torch.randn(12, 16, generator=g) * 2
    folders = [str(k) for k in range(1, 13)]
    lexical = sorted(folders)  # '1', '10', '11', '12', '2', ...: ImageFolder's class_to_idx

    def split(n, seed):
        pick = torch.randint(0, 12, (n,), generator=torch.Generator().manual_seed(seed))
        return centres[pick] + 0.5 * torch.randn(n, 16, generator=torch.Generator().manual_seed(seed + 1)), pick

    train_x, train_folder = split(2000, 5)
    val_x, val_folder = split(500, 7)
    train_y = torch.tensor([lexical.index(folders[k]) for k in train_folder.tolist()])
    model = nn.Linear(16, 12)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(train_x, train_y), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset(val_x, val_folder), batch_size=128),  # int(name) - 1
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    result = report.check("data.split_labels")
    issues = [i for i in result.issues if i.code == "VAL_LABEL_MAPPING"]
    assert issues and "sorted as strings in training ('1', '10', '11', '12', '2', ...)" in issues[0].message
    assert "class_to_idx" in issues[0].fix
    assert "TRAIN_ONLY_SHORTCUT" not in {i.code for i in result.issues}


@pytest.mark.parametrize("unlabelled", ["zeros", "ignored"])
def test_unlabelled_training_samples_filled_with_zero_while_validation_ignores_them(unlabelled):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (3000, 12), generator=g)
    y = torch.randint(0, 4, (3000,), generator=g)
    labelled = torch.rand(3000, generator=g) < 0.15  # 85% of the nodes/pixels have no label
    train_y = torch.where(labelled, y, torch.zeros_like(y) if unlabelled == "zeros" else torch.full_like(y, -100))
    val_y = torch.where(labelled, y, torch.full_like(y, -100))
    train, val = TensorDataset(ids[:2000], train_y[:2000]), TensorDataset(ids[2000:], val_y[2000:])
    model = nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(96, 4))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(train, batch_size=64, shuffle=True),
                           val_loader=DataLoader(val, batch_size=128), loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), SplitLabelsCheck()])
    found = [i for i in report.check("data.split_labels").issues if i.code == "VAL_LABEL_SHIFT"]
    if unlabelled == "zeros":
        assert found and "unlabelled samples of the training split were filled with 0" in found[0].message
        assert "np.full(n, -100)" in found[0].fix and "data.train stands for" in found[0].fix
    else:
        assert not found


class Folder(torch.utils.data.Dataset):
    """ImageFolder's numbering on an in-memory tree: its sorted non-empty class folders, 0..n-1."""

    def __init__(self, tree: dict, class_to_idx: dict | None = None):
        classes = sorted(name for name, images in tree.items() if len(images))
        self.class_to_idx = class_to_idx or {name: index for index, name in enumerate(classes)}
        self.samples = [(image, self.class_to_idx[name]) for name in classes for image in tree[name]]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index]


@pytest.mark.parametrize("shared_mapping", [False, True])
def test_folder_trees_joined_with_different_class_numbering(shared_mapping):
    g = torch.Generator().manual_seed(2)

    def tree(skip=None):
        return {name: ([] if name == skip else list(torch.randn(40, 3, 8, 8, generator=g) + k))
                for k, name in enumerate(("bicycle", "bus", "car", "truck"))}

    first = Folder(tree())
    second = Folder(tree(skip="bicycle"), class_to_idx=first.class_to_idx if shared_mapping else None)
    train = torch.utils.data.ConcatDataset([first, second])
    model = nn.Sequential(nn.Flatten(), nn.Linear(192, 4))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(train, batch_size=32, shuffle=True),
                           val_loader=DataLoader(Folder(tree()), batch_size=64), loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), SplitLabelsCheck()])
    found = [i for i in report.check("data.split_labels").issues if i.code == "CLASS_TO_IDX_MISMATCH"]
    assert bool(found) == (not shared_mapping)
    if found:
        assert "'bus': 1 vs 0" in found[0].message and "'bicycle'" in found[0].message
        assert "class_to_idx=first.class_to_idx" in found[0].fix


class SpectrogramFolder(torch.utils.data.Dataset):
    """Keyword spectrograms (1, 16, 20: 320 values, wider than the label-signal probes read)
    stored as files; labels from a CSV sorted by file name. The bug lists the files in
    file-system order (os.listdir), so features[i] and labels[i] are different recordings."""

    def __init__(self, sort_names: bool):
        g = torch.Generator().manual_seed(5)
        prototypes = torch.randn(4, 1, 16, 20, generator=torch.Generator().manual_seed(0))
        labels = torch.randint(0, 4, (1000,), generator=g)
        self.files = {f"rec_{i:04d}.pt": prototypes[labels[i]] + 0.7 * torch.randn(1, 16, 20, generator=g)
                      for i in range(1000)}
        listing = [list(self.files)[i] for i in torch.randperm(1000, generator=g).tolist()]  # file-system order
        self.names = sorted(listing) if sort_names else listing
        self.labels = [int(labels[i]) for i in range(1000)]  # the CSV, sorted by name

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        return self.files[self.names[i]], self.labels[i]


@pytest.mark.parametrize("sort_names", [False, True], ids=["listdir_order", "sorted_listing"])
def test_training_labels_paired_with_the_wrong_files_while_validation_is_right(sort_names):
    train = SpectrogramFolder(sort_names)
    val_x = torch.stack([train.files[name] for name in sorted(train.files)][:300])
    val_y = torch.tensor(train.labels[:300])
    model = nn.Sequential(nn.Flatten(), nn.Linear(320, 4))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(train, batch_size=32, shuffle=True),
                           val_loader=DataLoader(TensorDataset(val_x, val_y), batch_size=100),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    issues = [i for i in report.check("data.split_labels").issues if i.code == "LABELS_UNRELATED"]
    assert bool(issues) == (not sort_names)
    if issues:
        assert "os.listdir" in issues[0].message and "sorted(os.listdir(root))" in issues[0].fix


def reviews(keep_end: bool, n: int = 1200):
    """Reviews of 30-40 filler tokens whose verdict word (2-5 negative, 6-9 positive) sits in the
    last six, cut to 16 tokens from the start (the default) or the end."""
    g = torch.Generator().manual_seed(7)
    rows, labels = [], []
    for _ in range(n):
        length = int(torch.randint(30, 41, (1,), generator=g))
        body = torch.randint(10, 50, (length,), generator=g)
        label = int(torch.randint(0, 2, (1,), generator=g))
        body[length - 1 - int(torch.randint(0, 6, (1,), generator=g))] = 2 + 4 * label + int(torch.randint(0, 4, (1,), generator=g))
        rows.append(body[-16:] if keep_end else body[:16])
        labels.append(label)
    return TensorDataset(torch.stack(rows), torch.tensor(labels))


class BagOfWords(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.bag, self.head = nn.EmbeddingBag(50, 16, mode="mean"), nn.Linear(16, 2)

    def forward(self, ids):
        return self.head(self.bag(ids))


class ReadsInOrder(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.gru, self.head = nn.Embedding(50, 16), nn.GRU(16, 16, batch_first=True), nn.Linear(16, 2)

    def forward(self, ids):
        return self.head(self.gru(self.embed(ids))[0][:, -1])


@pytest.mark.parametrize("keep_end, model, warns", [(False, BagOfWords, True), (True, BagOfWords, False),
                                                    (False, ReadsInOrder, False)],
                         ids=["start_kept_bag_model", "end_kept_bag_model", "start_kept_order_aware_model"])
def test_texts_cut_before_their_verdict_for_a_bag_model(keep_end, model, warns):
    model = model()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(reviews(keep_end), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    found = [i for i in report.check("data.split_labels").issues if i.code == "LABELS_UNRELATED"]
    warnings = [i for i in found if i.severity.value == "warning"]
    assert bool(warnings) == warns
    if warns:
        assert "max_length=16" in warnings[0].message and "truncation_side='left'" in warnings[0].fix
    elif not keep_end:
        assert found and found[0].severity.value == "info"  # order may carry the label: a note, as before


class PositionsFromZero(nn.Module):
    """Learned positions initialised to zero: no order at init, but built to learn it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.tokens, self.positions = nn.Embedding(50, 16), nn.Embedding(16, 16)
        nn.init.zeros_(self.positions.weight)
        self.mix, self.head = nn.Sequential(nn.Linear(16, 16), nn.ReLU()), nn.Linear(16, 2)

    def forward(self, ids):
        return self.head(self.mix(self.tokens(ids) + self.positions.weight[: ids.shape[1]]).mean(1))


def test_a_position_table_that_starts_at_zero_is_no_bag():
    model = PositionsFromZero()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(reviews(keep_end=False), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    found = [i for i in report.check("data.split_labels").issues if i.code == "LABELS_UNRELATED"]
    assert found and all(i.severity.value == "info" for i in found)


def expert_rows(trajectories: int, seed: int, next_action: bool) -> TensorDataset:
    """A discrete expert's trajectories flattened to rows: the action is argmax(W s_t), the next
    state 0.3 s_t + e(a_t) + noise; with ``next_action`` each state is paired with a_{t+1}."""
    g = torch.Generator().manual_seed(seed)
    w, effect = torch.randn(6, 4, generator=torch.Generator().manual_seed(9)), torch.randn(4, 6, generator=g) * 0.5
    states, actions = torch.zeros(trajectories, 40, 6), torch.zeros(trajectories, 40, dtype=torch.long)
    s = torch.randn(trajectories, 6, generator=g)
    for t in range(40):
        a = (s @ w).argmax(1)
        states[:, t], actions[:, t] = s, a
        s = 0.3 * s + effect[a] + torch.randn(trajectories, 6, generator=g)
    if next_action:
        return TensorDataset(states[:, :-1].reshape(-1, 6), actions[:, 1:].reshape(-1))
    return TensorDataset(states.reshape(-1, 6), actions.reshape(-1))


@pytest.mark.parametrize("next_action", [True, False])
def test_states_paired_with_the_next_steps_actions_are_named_off_by_one(next_action):
    model = nn.Linear(6, 4)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(expert_rows(60, 0, next_action), batch_size=64, shuffle=True),
                           val_loader=DataLoader(expert_rows(15, 1, False), batch_size=128),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    issues = [i for i in report.check("data.split_labels").issues if i.code == "LABELS_UNRELATED"]
    assert bool(issues) == next_action
    if issues:
        assert "off by one row" in issues[0].message and "labels[i - 1]" in issues[0].message


def untrained_verdict(fold_into: int | None, val_classes: list[int] = (0, 1, 2, 3)) -> tuple[list, dict]:
    """2000 training tickets; with ``fold_into`` the 'feature_request' folder is missing from
    the label map and ``label_to_index.get(name, fold_into)`` files it under another class."""
    train_x, train_names = tickets(2000, 1, [0, 1, 2, 3])
    val_x, val_names = tickets(400, 2, list(val_classes))
    label_to_index = {name: i for i, name in enumerate(NAMES)}
    if fold_into is not None:
        del label_to_index["feature_request"]
    train_y = torch.tensor([label_to_index.get(name, fold_into) for name in train_names])
    val_y = encode(val_names, NAMES)
    model = nn.Linear(16, 4)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(train_x, train_y), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset(val_x, val_y), batch_size=128),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    result = report.check("data.split_labels")
    return [i for i in result.issues if i.severity.value == "warning"], result.data


def test_a_class_folded_into_another_by_a_default_in_the_label_map_is_named():
    issues, _ = untrained_verdict(fold_into=0)
    assert [i.code for i in issues] == ["VAL_CLASS_UNTRAINED"], issues
    assert "class 3" in issues[0].message and "label_to_index[name]" in issues[0].fix


def test_every_class_in_training_or_none_shared_with_validation_is_no_untrained_class():
    issues, _ = untrained_verdict(fold_into=None)
    assert not issues
    # Metric learning's protocol: validation holds classes training never sees, on purpose.
    train_x, _ = tickets(2000, 1, [0, 1])
    g = torch.Generator().manual_seed(3)
    train_y, val_y = torch.randint(0, 2, (2000,), generator=g), torch.randint(2, 4, (400,), generator=g)
    from optimus_preflight.preflight.checks.split_labels import label_shift
    shift = label_shift(train_y, val_y, with_untrained=True)
    assert shift is not None and shift.untrained == ()


def test_a_rare_class_that_training_lacks_by_chance_is_no_untrained_class():
    from optimus_preflight.preflight.checks.split_labels import label_shift
    g = torch.Generator().manual_seed(0)
    train_y = torch.randint(0, 4, (600,), generator=g)
    val_y = torch.cat([torch.randint(0, 4, (395,), generator=g), torch.full((5,), 4)])  # 1%: 6 expected in training
    assert label_shift(train_y, val_y, with_untrained=True) is None


def test_an_unshuffled_class_sorted_loader_read_in_part_is_no_untrained_class():
    # The first 2048 rows of a class-sorted table lack its last class; the table does not.
    train_x, train_names = tickets(4000, 1, [0, 1, 2, 3])
    train_y = encode(train_names, NAMES)
    order = train_y.argsort(stable=True)
    val_x, val_names = tickets(400, 2, [0, 1, 2, 3])
    model = nn.Linear(16, 4)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(train_x[order], train_y[order]), batch_size=64),
                           val_loader=DataLoader(TensorDataset(val_x, encode(val_names, NAMES)), batch_size=128),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    assert not [i for i in report.check("data.split_labels").issues if i.code == "VAL_CLASS_UNTRAINED"]


def test_a_training_batch_with_a_domain_column_is_not_compared_with_validation_labels():
    # DANN: training batches (x, y, domain), validation (x, y); the domain ids are no class labels.
    train_x, train_names = tickets(2000, 1, [0, 1, 2, 3])
    domain = torch.randint(0, 2, (2000,), generator=torch.Generator().manual_seed(5))
    train_x = train_x + 2.0 * domain[:, None]  # the second domain's sensor reads higher
    val_x, val_names = tickets(400, 2, [0, 1, 2, 3])
    model = nn.Linear(16, 4)

    def loss_fn(model, batch):
        return F.cross_entropy(model(batch[0]), batch[1])

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(train_x, encode(train_names, NAMES), domain), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset(val_x, encode(val_names, NAMES)), batch_size=128),
                           loss_fn=loss_fn, checks=[FirstBatchCheck(), SplitLabelsCheck()])
    assert not [i for i in report.check("data.split_labels").issues if i.severity.value == "warning"]


def unlike_verdict(val_pipeline: str) -> list:
    """Tone keywords as 32 log-band energies of an STFT at 8 kHz; training clips recorded at
    16 kHz and read without resampling hold each tone at half its frequency."""
    g = torch.Generator().manual_seed(0)

    def clips(n: int, rate: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, 6, (n,), generator=g)
        t = torch.arange(2048) / rate
        freq = (500.0 + 450.0 * y)[:, None] * (1 + 0.03 * torch.randn(n, 1, generator=g))
        wave = torch.sin(2 * torch.pi * freq * t) + 0.3 * torch.randn(n, 2048, generator=g)
        power = torch.stft(wave, 256, window=torch.hann_window(256), return_complex=True).abs().square().mean(-1)
        return torch.log1p(power[:, 1:129].reshape(n, 32, 4).sum(-1)), y

    train_x, train_y = clips(1500, 16000 if val_pipeline == "not_resampled" else 8000)
    val_x, val_y = clips(400, 8000)
    if val_pipeline == "drifted":
        val_x = val_x + 0.3  # another microphone's gain: every band a little louder
    mean, std = train_x.mean(), train_x.std()
    model = nn.Linear(32, 6)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset((train_x - mean) / std, train_y), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset((val_x - mean) / std, val_y), batch_size=128),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    return [i for i in report.check("data.split_labels").issues if i.severity.value == "warning"]


def test_validation_inputs_prepared_by_another_pipeline_are_named():
    issues = unlike_verdict("not_resampled")
    assert [i.code for i in issues] == ["VAL_UNLIKE_TRAINING"], issues
    assert "resampl" in issues[0].message and "one pipeline" in issues[0].fix


@pytest.mark.parametrize("val_pipeline", ["same", "drifted"])
def test_validation_from_the_same_pipeline_or_a_bridgeable_drift_is_quiet(val_pipeline):
    assert not unlike_verdict(val_pipeline)


def test_validation_on_an_earlier_task_the_model_learned_is_no_recoding_and_no_other_pipeline():
    # Continual learning: a model trained on task A trains on task B and validates on task A, one
    # feature space whose columns relate to the classes otherwise per task: a shift on purpose.
    g = torch.Generator().manual_seed(0)
    task_a, task_b = torch.randn(4, 16, generator=g) * 1.5, torch.randn(4, 16, generator=g) * 1.5
    train_y, val_y = torch.randint(0, 4, (1500,), generator=g), torch.randint(0, 4, (400,), generator=g)
    train_x = task_b[train_y] + torch.randn(1500, 16, generator=g)
    val_x = task_a[val_y] + torch.randn(400, 16, generator=g)
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    first_x, first_y = task_a[train_y] + torch.randn(1500, 16, generator=g), train_y  # task A, learned first
    optimizer = torch.optim.Adam(model.parameters(), 0.05)
    for _ in range(100):
        optimizer.zero_grad()
        F.cross_entropy(model(first_x), first_y).backward()
        optimizer.step()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(train_x, train_y), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset(val_x, val_y), batch_size=128),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    assert not report.check("data.split_labels").issues, report.check("data.split_labels").data
