"""The launcher the flows import (torch-free): one training run as an MPI job (``job``),
what a launch does with a run directory (``rundir``), and the rounds followed from the
ranks' output (``progress``)."""
