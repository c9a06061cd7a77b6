"""``python -m sketchopt.stream``: see :mod:`sketchopt.stream.cli`."""

import sys

from sketchopt.stream.cli import main

if __name__ == "__main__":
    sys.exit(main())
