"""Booster's algorithm: objective (eq. 9), contextual surrogate, and the planner (eq. 8)."""
