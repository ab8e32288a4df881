"""``python -m proxyfl.privacy``: :mod:`proxyfl.privacy.planned`'s table."""

import sys

from proxyfl.privacy.planned import main

if __name__ == "__main__":
    sys.exit(main())
