"""Booster: the contextual Bayesian-optimisation control plane for Fusion's θ."""

from importlib.metadata import PackageNotFoundError, version

# The distribution that installed this package: Booster's own, or the whole project's in a
# development checkout. Reported by ``booster --version`` and gemini_booster_build_info.
_DISTRIBUTIONS = ("gemini-booster", "gemini-cc")


def _version() -> str:
    for name in _DISTRIBUTIONS:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "0+unknown"


__version__ = _version()
