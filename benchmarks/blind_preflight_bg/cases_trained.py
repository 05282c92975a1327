"""Family what_is_trained: which branch / network the gradient and the optimizer reach."""

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_bg.cases_targets import MoCo, moco_kwargs, moco_loss
from benchmarks.blind_preflight_bg.registry import (SSLNet, case, fix, fixed_of, latent_signal, nt_xent,
                                                    retrieval_top1, seed, ssl_kwargs)


def simsiam_d(p, z):
    return -F.cosine_similarity(p, z, dim=-1).mean()


@case("simsiam_no_stop_gradient", "what_is_trained",
      "The SimSiam loss compares the predictor output with the other view's projection without .detach() (no "
      "stop-gradient on the target branch), so both branches chase each other and the representation collapses.",
      r"stop.?grad|detach|(target|other) (branch|view|projection).{0,60}(gradient|no_grad)|collaps")
def simsiam_no_stop_gradient(fixed=False):
    seed(0)

    def loss_fn(m, batch):
        z1, z2 = m.project(batch[0]), m.project(batch[1])
        p1, p2 = m.predictor(z1), m.predictor(z2)
        t1, t2 = (z1.detach(), z2.detach()) if fixed else (z1, z2)
        return 0.5 * (simsiam_d(p1, t2) + simsiam_d(p2, t1))
    return ssl_kwargs(SSLNet(predictor=True), loss_fn, latent_signal(1024, 0)[0], lr=1e-3)


fix("simsiam_no_stop_gradient", fixed_of(simsiam_no_stop_gradient), retrieval_top1, "val retrieval top-1")


@case("simsiam_stop_gradient_on_predictor", "what_is_trained",
      "The SimSiam stop-gradient is put on the predictor's output (p.detach()) instead of on the target projection, "
      "so the predictor never trains and the gradient flows only through the target branch.",
      r"(detach|stop.?grad)\w*.{0,100}(predictor|wrong (branch|side)|p\b|prediction)|"
      r"predictor.{0,80}(never|not|no) (train|learn|updat|gradient)|(target|projection) (branch|side) (instead|should)")
def simsiam_stop_gradient_on_predictor(fixed=False):
    seed(0)

    def loss_fn(m, batch):
        z1, z2 = m.project(batch[0]), m.project(batch[1])
        p1, p2 = m.predictor(z1), m.predictor(z2)
        if fixed:
            return 0.5 * (simsiam_d(p1, z2.detach()) + simsiam_d(p2, z1.detach()))
        return 0.5 * (simsiam_d(p1.detach(), z2) + simsiam_d(p2.detach(), z1))
    return ssl_kwargs(SSLNet(predictor=True), loss_fn, latent_signal(1024, 0)[0], lr=1e-3)


fix("simsiam_stop_gradient_on_predictor", fixed_of(simsiam_stop_gradient_on_predictor), retrieval_top1,
    "val retrieval top-1")


@case("simclr_encoder_under_no_grad", "what_is_trained",
      "The model's forward runs the encoder inside torch.no_grad() (copied from a frozen-backbone recipe), so only "
      "the projection head trains and the encoder's representation stays at its random initialisation.",
      r"no_grad|(encoder|backbone)\w*.{0,80}(no gradient|never (train|updat|learn)|not (train|updat|learn)|"
      r"random init|frozen|detach)|(only|just) the (projection )?head")
def simclr_encoder_under_no_grad(fixed=False):
    seed(0)

    class Net(SSLNet):
        def project(self, x):
            if fixed:
                return self.projector(self.encoder(x))
            with torch.no_grad():
                h = self.encoder(x)
            return self.projector(h)
    return ssl_kwargs(Net(), lambda m, b: nt_xent(m.project(b[0]), m.project(b[1])), latent_signal(1024, 0)[0])


fix("simclr_encoder_under_no_grad", fixed_of(simclr_encoder_under_no_grad), retrieval_top1, "val retrieval top-1")


@case("simclr_optimizer_projector_only", "what_is_trained",
      "The optimizer is built on model.projector.parameters() only, so the encoder (whose features are the "
      "representation) receives gradients but is never updated.",
      r"(optimi[sz]er|Adam).{0,120}(projector|head only|only the (projection )?head|encoder|backbone)|"
      r"(encoder|backbone)\w*.{0,80}(not|never|missing).{0,40}(optimi[sz]er|updat|param)")
def simclr_optimizer_projector_only(fixed=False):
    seed(0)
    model = SSLNet()
    params = model.parameters() if fixed else model.projector.parameters()
    return ssl_kwargs(model, lambda m, b: nt_xent(m.project(b[0]), m.project(b[1])), latent_signal(1024, 0)[0],
                      params=params)


fix("simclr_optimizer_projector_only", fixed_of(simclr_optimizer_projector_only), retrieval_top1,
    "val retrieval top-1")


@case("moco_optimizer_on_key_encoder", "what_is_trained",
      "The MoCo optimizer is built on the momentum key encoder's parameters (model.key) instead of the query "
      "encoder's, so the query encoder that receives the gradients is never stepped and the key encoder only "
      "tracks it by momentum.",
      r"(optimi[sz]er|Adam).{0,120}(key|momentum|target) (encoder|network|branch)|"
      r"(query|online) (encoder|network)\w*.{0,80}(not|never|missing).{0,40}(optimi[sz]er|updat|step)")
def moco_optimizer_on_key_encoder(fixed=False):
    seed(0)
    model = MoCo()
    params = list(model.net.parameters()) if fixed else list(model.key.parameters())
    return moco_kwargs(model, moco_loss(), params=params)


fix("moco_optimizer_on_key_encoder", fixed_of(moco_optimizer_on_key_encoder), retrieval_top1, "val retrieval top-1")
