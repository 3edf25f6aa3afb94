"""Moved: the arm cache reads storage, so it lives in the service layer
(``service/arm_cache.py``). This name re-exports it until ``service/core.py`` imports it from
there; it holds no code of its own."""

from ..service.arm_cache import PARAMS, ArmCache, arm_message

__all__ = ["PARAMS", "ArmCache", "arm_message"]
