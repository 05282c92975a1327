"""MosaicML Composer's ``composer.callbacks.OOMObserver``: its constructor, defaults and
file names, on the core's ``memory.oom.OOMRecorder``, without Composer's Trainer.

``folder`` and ``filename`` are Composer's format strings with ``{run_name}`` and
``{rank}``, resolved in the constructor so a bad field fails now and not inside the OOM
handler. ``remote_file_name`` is accepted and kept for Composer's callers; nothing is
uploaded, because this package has no uploaders.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.optim import Optimizer

from optimus_preflight.memory.oom import OOMRecorder

log = logging.getLogger("optimus_preflight")

__all__ = ["OOMObserver", "literal_name"]

DEFAULT_FOLDER = "{run_name}/torch_traces"
DEFAULT_FILENAME = "rank{rank}_oom"
DEFAULT_REMOTE_FILE_NAME = "{run_name}/oom_traces/rank{rank}_oom"


def format_name(template: str, *, run_name: str, rank: int) -> str:
    """``template`` with ``{run_name}`` and ``{rank}`` filled in; a ValueError names any other field."""
    try:
        return template.format(run_name=run_name, rank=rank)
    except (AttributeError, KeyError, IndexError, ValueError) as error:
        raise ValueError(
            f"OOMObserver: cannot format {template!r} ({type(error).__name__}: {error}); "
            "the fields it may use are {run_name} and {rank}, and literal braces are written {{ and }}"
        ) from None


def literal_name(text: str) -> str:
    """``text`` as a format string that formats to itself: a run directory may contain braces."""
    return text.replace("{", "{{").replace("}", "}}")


def default_run_name() -> str:
    """``$RUN_NAME``, else the local time. Ranks started in different seconds can get
    different names, so multi-rank runs should set RUN_NAME or pass ``run_name``."""
    return os.environ.get("RUN_NAME") or time.strftime("run-%Y%m%d-%H%M%S")


def default_rank() -> int:
    return int(os.environ.get("RANK", 0))


class OOMObserver(OOMRecorder):
    """Composer's OOMObserver: records CUDA allocator history and, on an OOM, writes
    Composer's five visualisations (``<filename>_snapshot.pickle``, ``_trace_plot.html``,
    ``_segment_plot.html``, ``_segment_flamegraph.svg``, ``_memory_flamegraph.svg``), plus
    this package's ``_summary.txt`` and a hint.

    The positional arguments and their defaults are Composer's. With ``overwrite=False``
    the resolved folder must be empty: ``start()`` raises FileExistsError if it is not.
    ``remote_file_name`` is kept as an attribute, but nothing is uploaded.

    The keyword-only arguments are this package's own. ``rank`` defaults to ``$RANK``,
    else 0. ``run_name`` defaults to ``$RUN_NAME``, else the local time. ``model``,
    ``optimizer``, ``hint_kwargs`` and ``snapshot_fn`` are ``OOMRecorder``'s.
    """

    def __init__(
        self,
        max_entries: int = 100_000,
        folder: str | os.PathLike[str] = DEFAULT_FOLDER,
        filename: str = DEFAULT_FILENAME,
        remote_file_name: str | None = DEFAULT_REMOTE_FILE_NAME,
        overwrite: bool = False,
        *,
        rank: int | None = None,
        run_name: str | None = None,
        model: nn.Module | None = None,
        optimizer: Optimizer | None = None,
        hint_kwargs: dict[str, Any] | None = None,
        snapshot_fn: Callable[[], dict[str, Any]] | None = None,
    ):
        if not filename:
            raise ValueError("OOMObserver: filename must name the files, e.g. 'rank{rank}_oom'")
        self.folder = os.fspath(folder)
        self.filename = filename
        self.remote_file_name = remote_file_name
        self.rank = default_rank() if rank is None else rank
        self.run_name = run_name or default_run_name()
        super().__init__(
            format_name(self.folder, run_name=self.run_name, rank=self.rank),
            format_name(filename, run_name=self.run_name, rank=self.rank),
            max_entries=max_entries,
            overwrite=overwrite,
            model=model,
            optimizer=optimizer,
            hint_kwargs=hint_kwargs,
            snapshot_fn=snapshot_fn,
        )
        if remote_file_name is not None and remote_file_name != DEFAULT_REMOTE_FILE_NAME:
            log.info(
                "OOMObserver: remote_file_name=%r is kept for Composer compatibility, but nothing is "
                "uploaded; the files stay in %s",
                remote_file_name,
                self.folder_path,
            )
