"""Blind preflight evaluation set x (NLP / sequence-to-sequence and hand-built training code)."""
