"""Blind preflight set bk: scientific machine learning and physics-informed regression."""
