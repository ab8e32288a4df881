"""Differentially private proxy-based federated learning (ProxyFL), its baselines and
PrivateKT over MPI.

One MPI rank is one client (one centre's HDF5 patch store). The entry point is
``mpiexec -n K python -m mpi4py -m proxyfl.run --config RUN_DIR/config.json`` (or flags:
``--algorithm ALG --data DIR --run-dir RUN_DIR ...``);
``python -m proxyfl.privacy`` prints the (ε, δ) each client will spend.

Rooms, by role (each module one idea):

- contracts every role shares: :mod:`~proxyfl.config` (the validated run configuration),
  :mod:`~proxyfl.names`, :mod:`~proxyfl.results` (metrics.jsonl / run.json),
  :mod:`~proxyfl.rules` (what a configuration must meet against its data);
- :mod:`proxyfl.launch` (the launcher the flows import, torch-free): ``placement`` (where
  a job's ranks run and what starts them), ``job`` (one run as an MPI job), ``rundir``
  (what a launch does with a run directory), ``progress``;
- :mod:`proxyfl.engine` (what a rank runs): ``access`` and ``data`` (the stores a rank
  opened, as datasets), ``models``, ``runtime`` (MPI, devices, seeds),
  ``local_training``, ``evaluate`` (accuracy, macro-accuracy), ``checkpoint``,
  ``validation`` (agreeing on bad input across ranks, failure records);
- :mod:`proxyfl.comm`: ``exchange`` (models over mpi4py buffers), ``graphs``
  (communication schedules), ``control`` (JSON control messages, never pickles);
- :mod:`proxyfl.privacy`: ``dp`` (Opacus DP-SGD wiring), ``accounting`` (the one ε
  function), ``ldp`` (randomized response, Lemma 1, Eq. 3), ``ledger`` (a client's ε in
  its notion), ``planned`` (``python -m proxyfl.privacy``);
- :mod:`proxyfl.algorithms`: ``strategies`` (the eight strategies), ``dml``
  (mutual-learning losses), ``privatekt`` (``strategy``, ``knowledge``: entropy sampling
  and the knowledge buffer, ``public_pool``: public images, never labels);
- a rank, wiring the rooms together: :mod:`~proxyfl.trainer` (a client's set-up and
  its steps of a round), :mod:`~proxyfl.records` (metrics, rank records, run.json),
  :mod:`~proxyfl.loop` (the one loop), :mod:`~proxyfl.rank_inputs` (a rank's inputs,
  checked before any training, then opened), :mod:`~proxyfl.run` (the entry point);
- shared with what reads finished runs (:mod:`analysis`, which imports this package and
  is never imported by it): :mod:`~proxyfl.results` and :mod:`~proxyfl.kept` (a run's
  files and their readers), :mod:`~proxyfl.canaries` (the canary plan a run plants).
"""

__all__: list[str] = []
