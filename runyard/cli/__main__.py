"""``python -m runyard.cli``."""

from __future__ import annotations

import sys

from runyard.cli.main import main

sys.exit(main())
