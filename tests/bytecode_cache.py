"""Write the bytecode of what the toolkit and its tests import, once, at install.

`make install` installs with ``pip --no-compile``: compiling every module of torch,
transformers and the rest took ~85 of the ~140 s an install took here, and most of those
modules are never imported. This imports what is, with bytecode writing on (the Makefile
unsets PYTHONDONTWRITEBYTECODE for it), so each later process reads it from the cache;
a module missed here is compiled in memory when imported, which is only slower."""

from __future__ import annotations

import importlib

MODULES = [
    "torch", "torch._dynamo", "torch._subclasses.fake_tensor", "torch.distributed", "torch.distributed.checkpoint",
    "torch.distributed.run", "torch.utils.tensorboard", "torch.cuda._memory_viz", "torch.testing", "numpy", "psutil",
    "tqdm", "hydra", "omegaconf", "hydra_plugins.hydra_submitit_launcher.submitit_launcher", "matplotlib.pyplot",
    "transformers", "transformers.models.gpt2.modeling_gpt2", "transformers.models.llama.modeling_llama",
    "transformers.models.bert.modeling_bert", "transformers.trainer", "accelerate", "pytorch_lightning", "pytest",
    "xdist", "optimus_preflight", "optimus_preflight.cli",
]

if __name__ == "__main__":
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as error:  # an extra that is not installed: nothing to cache
            print(f"bytecode cache: skipped {name} ({type(error).__name__}: {error})")
