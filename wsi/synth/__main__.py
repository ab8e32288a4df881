"""``python -m wsi.synth``."""

import sys

from plumbing.processes import start_command
from wsi.synth.cli import main

if __name__ == "__main__":
    start_command()
    sys.exit(main())
