"""Blind preflight evaluation set ae: self-supervised, generative and multi-output training (see README.md)."""
