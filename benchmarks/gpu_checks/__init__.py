"""Helpers of ``benchmarks/gpu_validation.py``: the GPU claims of the toolkit, checked on a real device.

``bootstrap`` and ``report`` use the standard library only (they run before torch is
known to be there); the other modules need torch and the installed project.
"""
