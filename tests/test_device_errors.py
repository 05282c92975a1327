"""STEP_ERROR's fix for the two errors a step raises only on an accelerator (text as torch
2.11 raised it on an H100 for the held-out sets' healthy cases moved to CUDA)."""

from __future__ import annotations

import torch

from optimus_preflight.preflight.analyses.device_errors import device_error_fix

CUDA = torch.device("cuda:0")
FRAME = "cases.py:55 in forward: packed = pack_padded_sequence(self.embed(tokens), lengths, batch_first=True)"


def test_packed_lengths_on_the_gpu_names_lengths_cpu():
    error = "RuntimeError: 'lengths' argument should be a 1D CPU int64 tensor, but got 1D cuda:0 Long tensor"
    fix = device_error_fix(error, CUDA, FRAME)
    assert fix is not None and "lengths.cpu()" in fix and FRAME in fix and "cuda:0" in fix


def test_tensor_made_on_the_cpu_names_device_and_register_buffer():
    for error in ("RuntimeError: Expected all tensors to be on the same device, but got index is on cpu, different "
                  "from other tensors on cuda:0 (when checking argument in method wrapper_CUDA__index_select)",
                  "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, "
                  "cuda:0 and cpu!",
                  # masked_fill words it its own way (seen on an H200 with a mask made by torch.eye(n))
                  "RuntimeError: expected self and mask to be on the same device, but got mask on cpu and self on "
                  "cuda:0"):
        fix = device_error_fix(error, CUDA, "m.py:3 in forward: a = adj + torch.eye(adj.size(1))")
        assert fix is not None and "device=x.device" in fix and "register_buffer" in fix


def test_other_errors_and_cpu_models_keep_the_generic_fix():
    assert device_error_fix("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 5x2)", CUDA, None) is None
    mixed = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, meta and cpu!"
    assert device_error_fix(mixed, torch.device("cpu"), None) is None
