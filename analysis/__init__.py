"""What is made of finished training runs: their report, the empirical privacy audit of
their kept models, and the staging of patients by those models.

The federated-learning library (:mod:`proxyfl`) trains and writes runs; this package
reads them, and sits above it and :mod:`wsi` in the house: it imports both, neither
imports it (tests/pipeline/test_dvc_deps.py). What both sides need lives in :mod:`proxyfl`: a run's
files and their readers (:mod:`proxyfl.results`, :mod:`proxyfl.kept`) and the canary plan
a run plants (:mod:`proxyfl.canaries`).

- :mod:`analysis.report`: tables, DVC metrics, learning curves, figures, report.html;
- :mod:`analysis.audit`: membership inference on the kept models (``scores``,
  ``membership``, ``references``: LiRA's reference models, ``population``) and the
  one-run ε lower bound (``one_run``) on a canary run; ``runs``: a run directory's audit
  rows; ``options``, ``freshness``, ``workers``;
- :mod:`analysis.staging`: from patches to patients: each hospital's kept models map its
  slides, the maps' lesions class its nodes, the nodes stage its patients.
"""

__all__: list[str] = []
