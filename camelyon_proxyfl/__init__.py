"""The pipeline's front door: the parameters file's models (:mod:`.params`) and the
``camelyon-proxyfl`` command (:mod:`.cli`)."""
