"""`python -m orchmllm`: the same command as the `orchmllm` console script."""

import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while the command's own modules import: one line, as main says it after
    print("orchmllm: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
