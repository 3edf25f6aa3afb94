"""Booster: the contextual Bayesian-optimisation control plane for Fusion's θ."""
