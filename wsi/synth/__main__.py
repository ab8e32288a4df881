"""``python -m wsi.synth``."""

import sys

from plumbing.processes import end_with_parent
from wsi.synth.cli import main

if __name__ == "__main__":
    end_with_parent()
    sys.exit(main())
