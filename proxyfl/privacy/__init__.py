"""Privacy: DP-SGD with Opacus (``dp``), its (ε, δ) accounting (``accounting``), PrivateKT's
label-level local DP (``ldp``), the per-client ledgers training records (``ledger``), and
the ε a configuration will spend before training (``planned``, ``python -m
proxyfl.privacy``)."""
