"""The rank program at NVIDIA FLARE sites: each centre a FLARE site that hosts its rank
(:class:`~proxyfl.sites.executor.RankExecutor`), the job paced by the FLARE server
(:class:`~proxyfl.sites.controller.RunController`), every message between ranks a FLARE
aux message (:mod:`proxyfl.comm.flare`), relayed by the server over mutual TLS with a
certificate per site.

The rank program is :func:`proxyfl.run.run_rank`, unchanged, over a
:class:`~proxyfl.comm.world.MessageWorld`. :mod:`proxyfl.launch.flare` runs such a job on
one machine, :mod:`proxyfl.sites.submit` submits one to a running federation (each
site in its own folders: :mod:`proxyfl.sites.federation`); :mod:`proxyfl.launch.kits`
writes the participants' startup kits (docs/sites.md).
"""
