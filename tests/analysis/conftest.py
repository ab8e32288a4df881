"""Fixtures for the tests of what reads finished runs (analysis): the runs and stores they
read are made as the library's own tests make them (tests/proxyfl/conftest.py)."""

from __future__ import annotations

from tests.proxyfl.conftest import helpers, stores

__all__ = ["helpers", "stores"]
