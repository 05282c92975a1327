"""Blind preflight evaluation set ab: transfer learning, fine-tuning and multi-task setups (see README.md)."""
