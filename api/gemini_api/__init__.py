"""Gemini's contracts: the θ specification and the agent↔Booster protobuf API."""
