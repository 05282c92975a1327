"""Blind preflight evaluation set p: 25 broken real-user bugs (5 per family) and 10 healthy setups."""
