"""`python -m sglang_snapmla`: the environment report (sglang_snapmla/environment.py)."""

import sys

from .environment import main

sys.exit(main())
