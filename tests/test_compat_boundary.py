"""Other projects' APIs live in ``optimus_preflight/compat/`` only: the core (config/,
memory/, preflight/) names no seed project, none of their config keys and none of their
function names, and nothing but the package's top imports ``compat``."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "optimus_preflight"
CORE = ("config", "memory", "preflight")

# The seed projects, by name (an identifier part counts: credit_layout, _nss_keys).
PROJECTS = re.compile(r"(?i)(?<![a-z])(credit|nss|composer|mosaicml|nemo|safe.synthesizer)(?![a-z])")
# Their config keys and the names of their functions and classes.
SEED_NAMES = (
    # CREDIT's config layout
    "thread_workers", "train_batch_size", "image_height", "image_width", "surface_channels",
    "input_only_channels", "vars_3D", "vars_2D", "data.source",
    # NSS's training settings
    "peft_implementation", "quantize_model", "quantization_bits", "quantization_scheme", "loftq",
    # Composer's OOMObserver
    "remote_file_name", "OOMObserver",
    # the seed functions
    "estimate_dataloader_memory_gib", "check_dataloader_startup", "check_model_gpu_memory",
    "param_count_from_empty_model", "estimate_params_from_shape", "estimate_base_model_params",
    "bytes_per_base_weight",
)


def _core_files():
    return sorted(path for layer in CORE for path in (PACKAGE / layer).rglob("*") if path.is_file()
                  and path.suffix in (".py", ".yaml", ".md", ".txt"))


def test_the_core_files_are_found():
    assert len(_core_files()) > 20


@pytest.mark.parametrize("layer", CORE)
def test_the_core_names_no_seed_project_and_none_of_their_keys_or_names(layer):
    found = []
    for path in _core_files():
        if path.relative_to(PACKAGE).parts[0] != layer:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            hits = [m.group(0) for m in PROJECTS.finditer(line)] + [name for name in SEED_NAMES if name in line]
            if hits:
                found.append(f"{path.relative_to(REPO)}:{number}: {hits}")
    assert not found, "\n".join(found)


def test_only_the_package_top_imports_compat():
    """compat sits on the core; the layering test ranks it last, this names the importers."""
    importers = []
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] == "compat" or path == PACKAGE / "__init__.py":
            continue
        if re.search(r"^\s*(from|import)\s+optimus_preflight\.compat\b", path.read_text(), re.MULTILINE):
            importers.append(str(path.relative_to(REPO)))
    assert not importers
