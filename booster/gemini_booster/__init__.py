"""Booster: the contextual Bayesian-optimisation control plane for Fusion's θ."""

from importlib.metadata import PackageNotFoundError, version


def _version() -> str:
    """The installed gemini-booster distribution's version, reported by ``booster --version``
    and gemini_booster_build_info."""
    try:
        return version("gemini-booster")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _version()
