"""From patches to patients: each hospital's kept models map its own slides, the maps'
lesions class its lymph nodes, the nodes stage its patients (docs/algorithms.md §4).

- :mod:`analysis.staging.models`: which kept model of a run stages which centre, and a
  predictor of it for :mod:`wsi.heatmap`;
- :mod:`analysis.staging.centre`: one centre's staging: its test patients' slides, their
  maps, each patient's threshold chosen on the centre's other test patients, the calls,
  written to ``STAGING/center_{c}/`` (maps and ``calls.json``: nothing leaves it);
- :mod:`analysis.staging.summary`: every centre's calls into one method's measures
  (:mod:`analysis.report.staging`), ``results/staging.json``.

The rules (node class, pN stage) are :mod:`wsi.nodes`'; lesions from a map are
:mod:`wsi.lesions`'.
"""
