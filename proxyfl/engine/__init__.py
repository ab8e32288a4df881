"""The engine a rank runs: its data (``access``, ``data``), models, runtime (device,
threads), local training steps, evaluation, checkpoints, and the rules by which its ranks
fail together (``validation``). Algorithms and privacy build on it; the launcher never
imports it (it needs torch)."""
