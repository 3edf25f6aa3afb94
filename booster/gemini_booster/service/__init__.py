"""Booster's front doors: gRPC for agents, REST for operators, Prometheus metrics."""
