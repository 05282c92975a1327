"""The fact each of set o's bugs rests on, printed by ``verify.py`` before the case is trained next to its fix (no
preflight involved). Importing this module loads the cases and attaches one function per broken case to FIXES."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_o.registry import FIXES, load_all

load_all()                                        # the cases in family order, before the modules are named below

from benchmarks.blind_preflight_o import cases_data as data  # noqa: E402
from benchmarks.blind_preflight_o import cases_mechanics as mech  # noqa: E402
from benchmarks.blind_preflight_o import cases_shapes as shapes  # noqa: E402
from benchmarks.blind_preflight_o import cases_targets as targets  # noqa: E402
from benchmarks.blind_preflight_o import cases_trained as trained  # noqa: E402

FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        return fn
    return register


def say(text: str) -> None:
    print("  fact: " + text)


@fact("shapes_tiles_reshaped_not_permuted")
def _tiles():
    arr, labels = shapes.land_tiles(1, 1)
    wrong, right = torch.tensor(arr).reshape(-1, 3, 12, 12), torch.tensor(arr).permute(0, 3, 1, 2)
    same = torch.equal(wrong, right)
    say(f"reshape == permute: {same}; reshape's channel 0 row 0 holds pixels (0,0..3) with their R,G,B interleaved: "
        f"{torch.allclose(wrong[0, 0, 0, :3], torch.tensor(arr[0, 0, 0, :]))}")


@fact("shapes_pointnet_log_softmax_dim0")
def _pointnet():
    model = shapes.PointNetLite(dim=0)
    x, _ = shapes.point_clouds(4, 2)
    with torch.no_grad():
        out, single = model(x), model(x[:1])
    say(f"class probabilities per cloud sum to {[round(v, 3) for v in out.exp().sum(1).tolist()]}, per class column "
        f"over the batch to {[round(v, 3) for v in out.exp().sum(0).tolist()]}; a cloud scored alone gets "
        f"log-probabilities {single[0].tolist()}")


@fact("shapes_session_gru_reads_padding_step")
def _sessions():
    seqs, lengths, _ = shapes.sessions(2000, 3)
    say(f"out[:, -1] is a padding step for {(lengths < 40).float().mean():.0%} of sessions; mean padding steps after the "
        f"last click: {(40 - lengths).float().mean():.1f}")


@fact("shapes_attention_over_batch_axis")
def _motif():
    model = shapes.MotifAttention(fixed=False).eval()
    x, _ = shapes.repeat_motif(8, 4)
    other = x.clone()
    other[1:] = torch.randint(1, 20, other[1:].shape)
    with torch.no_grad():
        changed = not torch.allclose(model(x)[0], model(other)[0])
    say(f"attn.batch_first={model.attn.batch_first}; sample 0's output changes when only the other samples change: "
        f"{changed}")


@fact("shapes_tagger_time_major_vs_batch_major")
def _tagger():
    tokens, tags = shapes.tag_data(32, 5)
    flat_time_major = tags.t().reshape(-1)
    say(f"tags.view(-1) agrees with the time-major order of the logits on "
        f"{(tags.reshape(-1) == flat_time_major).float().mean():.0%} of the rows (chance for 5 tags: ~20%)")


@fact("targets_bce_masks_in_minus_one_one")
def _cells():
    _, masks = targets.cell_images(50, 6)
    m = (masks - 0.5) / 0.5
    loss = nn.BCEWithLogitsLoss()(torch.full((1,), -8.0), torch.full((1,), -1.0))
    say(f"mask values after Normalize: {sorted(m.unique().tolist())}; BCEWithLogitsLoss(logit=-8, target=-1) = "
        f"{loss.item():.2f}")


@fact("targets_word_tags_not_aligned_to_subwords")
def _ner():
    row_bad, row_good = targets.TaggedSentences(1, 8, False)[0], targets.TaggedSentences(1, 8, True)[0]
    bad, good = row_bad["labels"][:12].tolist(), row_good["labels"][:12].tolist()
    say(f"first 12 token labels unaligned {bad} vs aligned {good}")


@fact("targets_infonce_labels_all_zero")
def _infonce():
    say("logits = q @ d.T puts the positive of query i in column i; labels=torch.zeros(B) names column 0 for all: "
        f"{torch.zeros(4, dtype=torch.long).tolist()} vs {torch.arange(4).tolist()}")


@fact("targets_td_target_ignores_done")
def _td():
    say(f"true V(9) = {targets.true_values()[-1]:.3f}; without (1 - done) the target of 9 -> 10 is 1 + 0.9 * V(10) and "
        f"V(10) is the network's extrapolation, a fixed point near 1 / (1 - 0.9) = 10 if V is flat there")


@fact("targets_forecast_target_is_last_input")
def _forecast():
    x, y = targets.create_dataset(targets.demand_series()[:300], fixed=False)
    say(f"targets equal the last input value: {torch.equal(y, x[:, -1])}")


@fact("trained_new_head_not_in_optimizer")
def _head():
    kw = trained.build_keywords()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    head = list(kw["model"].fc.parameters())
    say(f"fc params in the optimizer: {sum(id(p) in in_opt for p in head)}/{len(head)}; parameters requiring grad: "
        f"{[n for n, p in kw['model'].named_parameters() if p.requires_grad]}")


@fact("trained_transposed_parameter_not_registered")
def _probe():
    model = trained.LowRankProbe(fixed=False)
    say(f"named_parameters: {[n for n, _ in model.named_parameters()]}; proj is_leaf={model.proj.is_leaf}, "
        f"type {type(model.proj).__name__}")


@fact("trained_pretrained_item_embeddings_frozen")
def _items():
    emb = nn.Embedding.from_pretrained(torch.randn(3, 2))
    say(f"nn.Embedding.from_pretrained(w).weight.requires_grad = {emb.weight.requires_grad}")


@fact("trained_encoder_under_no_grad")
def _calls():
    model = trained.CallClassifier(fixed=False)
    x, y = trained.chirps(8, 17)
    F.cross_entropy(model(x), y).backward()
    say(f"encoder grads after backward: {[p.grad for p in model.encoder.parameters()][:2]} ...; head grad set: "
        f"{model.head.weight.grad is not None}")


@fact("trained_requires_grad_set_on_module")
def _reviews():
    kw = trained.build_reviews()
    trainable = [n for n, p in kw["model"].named_parameters() if p.requires_grad]
    say(f"parameters requiring grad: {trainable}")


@fact("mech_lambdalr_returns_lr_not_factor")
def _lambdalr():
    kw = mech.build_credit()
    say(f"lr at the first step: {kw['optimizer'].param_groups[0]['lr']:.1e} (base lr 1e-3)")


@fact("mech_round_inside_loss")
def _round():
    kw = mech.build_ratings()
    batch = next(iter(kw["train_loader"]))
    kw["loss_fn"](kw["model"], batch).backward()
    say(f"gradient norm through torch.round: {sum(p.grad.norm() ** 2 for p in kw['model'].parameters()) ** 0.5:.1f}")


@fact("mech_functional_dropout_active_in_eval")
def _dropout():
    model = mech.CTRNet(fixed=False).eval()
    cols, _ = mech.impressions(4, 22)
    with torch.no_grad():
        a, b = model(cols), model(cols)
    say(f"model.eval(); two forwards of the same rows equal: {torch.equal(a, b)}")


@fact("mech_vae_kl_added_with_wrong_sign")
def _kl():
    mu, logvar = torch.zeros(1), torch.tensor([0.0, 4.0])
    kld = 0.5 * (1 + logvar - mu ** 2 - logvar.exp())
    say(f"0.5 * (1 + logvar - mu^2 - exp(logvar)) at logvar 0 and 4: {kld.tolist()} (it is -KL: adding it rewards "
        f"large KL)")


@fact("mech_nll_loss_on_raw_logits")
def _nll():
    logits = torch.tensor([[5.0, 0.0], [30.0, 0.0]])
    say(f"nn.NLLLoss on raw logits [[5, 0], [30, 0]] with target 0: {nn.NLLLoss(reduction='none')(logits, torch.zeros(2, dtype=torch.long)).tolist()}")


@fact("data_val_word_index_refit")
def _vocab():
    texts, _ = data.tickets(2400, 27)
    train, val = data.fit_word_index(texts[:2000]), data.fit_word_index(texts[2000:])
    shared = [w for w in train if w in val]
    say(f"words with the same id in both indexes: {sum(train[w] == val[w] for w in shared)}/{len(shared)}")


@fact("data_hflip_on_direction_signs")
def _flip():
    x, y = data.arrow_images(200, 28)
    left, right = (y == 2), (y == 0)
    say(f"mean flipped 'left' arrow vs mean 'right' arrow correlation: "
        f"{torch.corrcoef(torch.stack([torch.flip(x[left], dims=[-1]).mean(0).flatten(), x[right].mean(0).flatten()]))[0, 1]:.2f}")


@fact("data_centred_rolling_feature_leaks_target")
def _rolling():
    series = data.demand()
    t = torch.arange(30, 2500)
    for centred in (True, False):
        feat = data.rolling_mean(series, centred)[t]
        say(f"corr(feature, target) with centred={centred}: {torch.corrcoef(torch.stack([feat, series[t]]))[0, 1]:.2f}")


@fact("data_val_scaler_refit_on_val")
def _scaler():
    x, _ = data.listings(1600, 30, newer=False)
    xv, _ = data.listings(300, 31, newer=True)
    train = data.Standardizer().fit(x)
    say(f"mean standardised sqft of the val houses: train scaler {train.transform(xv)[:, 0].mean():.2f}, own scaler "
        f"{data.Standardizer().fit(xv).transform(xv)[:, 0].mean():.2f}")


@fact("data_listdir_pairs_clips_with_wrong_labels")
def _listdir():
    clips, labels = data.sound_archive(200, 33, "train")
    wav, lab = data.listdir(list(clips)), sorted(data.listdir(list(labels)))
    say(f"clip/label pairs with the same stem: {sum(a[:-4] == b[:-4] for a, b in zip(wav, lab))}/{len(wav)}")


for _name, _fn in FACTS.items():
    FIXES[_name]["fact"] = _fn
