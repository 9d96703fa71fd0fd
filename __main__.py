"""`python -m orchmllm`: the same command as the `orchmllm` console script."""

import sys

from .cli import main

sys.exit(main())
