"""``python -m tests.fuzz --target X --seconds 600``: see tests/fuzz/README.md."""

import sys

from tests.fuzz.engine import main

if __name__ == "__main__":
    sys.exit(main())
