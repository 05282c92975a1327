"""Blind preflight evaluation set m: 25 broken setups sampled from real user reports, 10 healthy ones."""
