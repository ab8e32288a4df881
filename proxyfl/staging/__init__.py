"""From patches to patients: each hospital's kept models map its own slides, the maps'
lesions class its lymph nodes, the nodes stage its patients (docs/algorithms.md §4).

- :mod:`proxyfl.staging.models`: which kept model of a run stages which centre, and a
  predictor of it for :mod:`wsi.heatmap`;
- :mod:`proxyfl.staging.centre`: one centre's staging: its slides, their maps, the
  threshold chosen on its training patients, the calls on its test patients, written to
  ``STAGING/center_{c}/`` (maps and ``calls.json``: nothing leaves the centre's folder);
- :mod:`proxyfl.staging.summary`: every centre's calls into one method's measures
  (:mod:`proxyfl.report.staging`), ``results/staging.json``.

The rules (node class, pN stage) are :mod:`wsi.nodes`'; lesions from a map are
:mod:`wsi.lesions`'.
"""
