"""``python -m gateway``: the ``gateway`` command."""

import sys

from gateway.cli import main

if __name__ == "__main__":
    sys.exit(main())
