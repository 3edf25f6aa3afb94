"""Version 1 of the agent↔Booster API (protobuf package ``gemini.booster.v1``)."""
