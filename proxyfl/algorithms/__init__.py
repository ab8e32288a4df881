"""The methods: eight strategies over one training loop (``strategies``; ``dml``, the
distillation loss of FML and ProxyFL), PrivateKT in its own sub-package."""
