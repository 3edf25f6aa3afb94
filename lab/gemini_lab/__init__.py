"""Gemini's lab: a stock Debian kernel under qemu, real TCP over netem links, Fusion loaded."""
