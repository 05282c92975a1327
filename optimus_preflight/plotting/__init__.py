"""Plots of runs, sweeps and LR range tests; matplotlib is an optional extra ([plot])."""
