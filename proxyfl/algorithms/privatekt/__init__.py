"""PrivateKT (docs/algorithms.md §4): the strategy (``strategy``), its knowledge buffer and
sampling (``knowledge``), and the unlabelled public pool (``public_pool``)."""
