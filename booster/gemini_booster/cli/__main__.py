"""``python -m gemini_booster.cli``: the ``booster`` command."""

import sys

from . import main

if __name__ == "__main__":  # not when a tool imports every module of the package
    sys.exit(main())
