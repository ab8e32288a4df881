"""``params.yaml``: one pydantic model per section, in one module per section.

    data:        data.DataSection              (root; synth: wsi.synth's settings)
    preprocess:  preprocess.PreprocessSection  (wsi.params' patch and sampling rules + ...)
    train:       train.TrainSection            (options: proxyfl.config.TrainOptions)
    audit:       audit.AuditSection            (analysis.audit.options.AuditOptions + files)
    stage:       stage.StageSection            (the staging of patients: analysis.staging)
    report:      report.ReportSection

Every default and help text is a field of these models (or of the library models they
are made of), defined once; every command line is generated from them
(:mod:`plumbing.cli`). The defaults are the paper's configuration; ``params.yaml`` is the
demo's. Each command validates only the sections it reads (a stage's model,
:class:`~camelyon_proxyfl.params.base.StageParams`), so that a stage depends on the code
of its own sections only: preprocessing never imports ``proxyfl``, training never
``wsi.synth``. :mod:`~camelyon_proxyfl.params.whole` is the whole file, for the pipeline.
Unknown sections and keys are errors, never silently ignored.

This package's ``__init__`` imports nothing, so that importing one section's module
loads that section's code only.
"""
