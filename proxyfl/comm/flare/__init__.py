"""Messages between FLARE sites (:mod:`proxyfl.comm.flare.link`): the transport of a job
whose ranks are NVIDIA FLARE sites (:mod:`proxyfl.sites`)."""
