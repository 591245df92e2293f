"""``python -m semframe``: the ``semframe`` command (:mod:`semframe.cli`) with this Python."""

import sys

from semframe.cli import main

if __name__ == "__main__":
    sys.exit(main())
