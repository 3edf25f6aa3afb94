"""Gemini's host agent: kernel flow records → per-(θ, context) aggregates → Booster → θ back."""
