"""``python -m gemini_booster.cli``: the ``booster`` command."""

import sys

from . import main

sys.exit(main())
