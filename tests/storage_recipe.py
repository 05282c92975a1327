"""A char-LM recipe that fills its own run dir's disk at a chosen training step
(FILL_AT_STEP): a bad day on a cluster, arriving mid-run."""

from __future__ import annotations

import errno
import os

from optimus_preflight.recipes.char_lm import CharLMRecipe


def fill_disk(directory) -> None:
    """Write zeros into ``directory`` until the filesystem refuses more."""
    block = b"\0" * (1 << 16)
    with open(os.path.join(directory, "filler"), "ab") as handle:
        while True:
            try:
                handle.write(block)
                handle.flush()
            except OSError as error:
                if error.errno in (errno.ENOSPC, errno.EDQUOT):
                    return
                raise


class DiskFillingRecipe(CharLMRecipe):
    def compute_loss(self, model, batch):
        at = int(os.environ.get("FILL_AT_STEP", "0"))
        if at and model.training and self.preflight_report is not None and self.state.step == at:
            fill_disk(self.run_dir)
            os.environ["FILL_AT_STEP"] = "0"
        return super().compute_loss(model, batch)
