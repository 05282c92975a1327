"""The LR schedules by the dotted paths configs name (``optimus_preflight.optim.warmup_cosine``,
``...constant``): kept stable so a saved config, and a resume comparing configs, see no
change. They live in ``training.optim``."""

from optimus_preflight.training.optim import *  # noqa: F401,F403
