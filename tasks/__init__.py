"""Prefect tasks: thin wrappers over ``wsi`` and ``proxyfl`` (retries, caching, logging)."""
