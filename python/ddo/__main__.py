"""`python -m ddo ARGS` and the `ddo` command: the C tool shipped in this package."""

import sys

from ._tool import main

if __name__ == "__main__":
    sys.exit(main())
