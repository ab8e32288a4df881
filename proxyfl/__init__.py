"""Differentially private proxy-based federated learning (ProxyFL), its baselines and
PrivateKT over MPI.

One MPI rank is one client (one centre's HDF5 patch store). The entry point is
``mpiexec -n K python -m mpi4py -m proxyfl.run --config RUN_DIR/config.json`` (or flags:
``--algorithm ALG --data DIR --out RUN_DIR ...``);
``python -m proxyfl.privacy`` prints the (ε, δ) each client will spend.

Modules, one idea each: :mod:`~proxyfl.config` (validated run configuration),
:mod:`~proxyfl.models` (model registry), :mod:`~proxyfl.data` (patch stores as datasets),
:mod:`~proxyfl.dml` (mutual-learning losses), :mod:`~proxyfl.dp` (Opacus DP-SGD wiring),
:mod:`~proxyfl.accounting` (the one ε function), :mod:`~proxyfl.graphs` (communication
schedules), :mod:`~proxyfl.comm` (model exchange over mpi4py buffers),
:mod:`~proxyfl.algorithms` (the eight strategies), :mod:`~proxyfl.trainer` (the shared
loop), :mod:`~proxyfl.local_training` (training without DP), :mod:`~proxyfl.ledger` (a
client's ε in its notion), :mod:`~proxyfl.ldp` (randomized response, Lemma 1, Eq. 3),
:mod:`~proxyfl.knowledge` (entropy sampling, knowledge buffer), :mod:`~proxyfl.public_pool`
(public images, never labels), :mod:`~proxyfl.privatekt` (PrivateKT's exchange),
:mod:`~proxyfl.access` (the stores a rank opened), :mod:`~proxyfl.evaluate` (accuracy,
macro-accuracy), :mod:`~proxyfl.checkpoint`,
:mod:`~proxyfl.results` (metrics.jsonl / run.json), :mod:`~proxyfl.report` (tables,
curves, figures), :mod:`~proxyfl.runtime` (MPI, devices, seeds), :mod:`~proxyfl.validation`
(agreeing on bad input across ranks, failure records).
"""

__all__: list[str] = []
