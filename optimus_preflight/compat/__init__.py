"""Other projects' APIs on the core's typed functions: the names, signatures and config
layouts their users call, so code written for them runs here unchanged.

- ``compat.credit``: NCAR CREDIT's ``credit.trainers.preflight``
  (``estimate_dataloader_memory_gib``, ``check_dataloader_startup``,
  ``check_model_gpu_memory``) on CREDIT's config layout and ours.
- ``compat.nss``: NeMo Safe Synthesizer's parameter counts and bytes per base weight.
- ``compat.composer``: MosaicML Composer's ``OOMObserver``.

The top layer: it imports the core, and the core never imports it. Importing this
package imports none of them (each pulls in its part of the core).
"""
