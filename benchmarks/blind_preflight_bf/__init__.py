"""Blind preflight set bf: graph learning and recommender systems (see README.md)."""
