"""Where the OOM recorder writes its files and how: the overwrite rule, the artefact
paths, and flamegraphs drawn without a download.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from optimus_preflight.memory.flamegraph_svg import render_flamegraph_svg

log = logging.getLogger("optimus_preflight")

# flamegraph.pl takes seconds even on big snapshots. The limit only keeps a hung
# subprocess from hanging the OOM handler, and the training process with it.
FLAMEGRAPH_TIMEOUT_S = 120.0


def ensure_folder_is_empty(folder: Path) -> None:
    """Raise FileExistsError if ``folder`` holds a file, searching sub-folders too.

    Hidden files and folders (a leading ``.``) do not count: tools keep caches and
    markers there. A missing folder counts as empty.
    """
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(name for name in dirs if not name.startswith("."))
        for name in sorted(files):
            if not name.startswith("."):
                raise FileExistsError(
                    f"the OOM trace folder {folder} is not empty ({Path(root) / name} exists), "
                    "and with overwrite=False it must be. Pass overwrite=True to let new OOM traces "
                    "replace old ones, or choose another folder."
                )


# In the order they are written: the snapshot first, the evidence every other file is drawn from.
ARTIFACT_SUFFIXES = {
    "snapshot": "_snapshot.pickle",
    "trace_plot": "_trace_plot.html",
    "segment_plot": "_segment_plot.html",
    "segment_flamegraph": "_segment_flamegraph.svg",
    "memory_flamegraph": "_memory_flamegraph.svg",
    "summary": "_summary.txt",
}


@dataclass(frozen=True)
class OOMArtifacts:
    """Where one recorder writes each file: ``folder/prefix`` plus a suffix."""

    snapshot: Path
    trace_plot: Path
    segment_plot: Path
    segment_flamegraph: Path
    memory_flamegraph: Path
    summary: Path

    @classmethod
    def from_prefix(cls, prefix: Path) -> OOMArtifacts:
        return cls(**{name: Path(f"{prefix}{suffix}") for name, suffix in ARTIFACT_SUFFIXES.items()})

    def paths(self) -> list[Path]:
        return [getattr(self, item.name) for item in fields(self)]


def local_flamegraph_script() -> Path | None:
    """A ``flamegraph.pl`` on this machine: on PATH, else where torch caches it.

    ``torch.cuda._memory_viz.format_flamegraph`` looks in ``~/.cache/flamegraph.pl`` and
    downloads the script there when it is missing. This only looks.
    """
    on_path = shutil.which("flamegraph.pl")
    if on_path:
        return Path(on_path)
    cached = Path(os.path.expanduser("~/.cache")) / "flamegraph.pl"
    return cached if cached.is_file() else None


def run_flamegraph_script(script: Path, folded: str, timeout_s: float = FLAMEGRAPH_TIMEOUT_S) -> str:
    """The SVG ``flamegraph.pl`` draws for the folded stacks ``folded``.

    This uses the same command line as torch's ``format_flamegraph(lines, script)``. It
    is run here, not through torch, for two reasons. Torch's function can download the
    script if the file disappears after we find it. It also has no timeout.
    """
    result = subprocess.run(
        [str(script), "--countname", "bytes"],
        input=folded,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
    return result.stdout


def flamegraph_formatter(title: str, script: Path | None = None) -> Callable[[str], str]:
    """A ``format_flamegraph`` for ``_memory_viz.segments``/``memory`` that never downloads.

    If ``script`` (a local ``flamegraph.pl``) is given, it draws the graph. If it is
    missing or fails, ``render_flamegraph_svg`` draws it.
    """

    def format_flamegraph(folded: str) -> str:
        if script is not None:
            try:
                return run_flamegraph_script(script, folded)
            except (OSError, subprocess.SubprocessError) as error:
                log.info("OOM recorder: %s failed (%s); drawing the flamegraph without it", script, error)
        return render_flamegraph_svg(folded, title=title)

    return format_flamegraph


def write_artifact(path: Path, render: Callable[[], str | bytes]) -> None:
    # Rendered before the file is opened: a renderer that raises leaves no empty file behind.
    content = render()
    try:
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    except BaseException:
        path.unlink(missing_ok=True)  # a full disk must not leave half a file that looks whole
        raise
