"""When ``compile: auto`` compiles, and the persistent cache's markers (the compiled
graphs themselves, and no recompilation after the pre-run check: test_dp.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxyfl.engine import compilation
from proxyfl.privacy.accounting import poisson_schedule

PAPER_PIXELS = 32 * 512 * 512


def _paper_steps(rounds: int, n_train: int = 2937) -> int:
    return rounds * poisson_schedule(n_train, 32)[1]


def test_a_paper_run_compiles_and_the_gpu_benchs_short_job_does_not() -> None:
    """The figures of the module doc: 30 rounds of C3's 2,937 patches repay a cold
    compilation (92 steps a round), 3 rounds do not, whatever the cache says."""
    assert _paper_steps(30) == 30 * 92
    assert compilation.compile_pays(_paper_steps(30), PAPER_PIXELS, mutual_learning=True,
                                    cache_serves=False)  # fmt: skip
    for served in (False, True):
        assert not compilation.compile_pays(_paper_steps(3, 429), PAPER_PIXELS,
                                            mutual_learning=True, cache_serves=served)  # fmt: skip


def test_a_served_cache_and_larger_batches_make_it_pay_sooner() -> None:
    steps = _paper_steps(10)  # 920 steps save 46 s: less than a cold compilation
    assert not compilation.compile_pays(steps, PAPER_PIXELS, mutual_learning=True,
                                        cache_serves=False)  # fmt: skip
    assert compilation.compile_pays(steps, PAPER_PIXELS, mutual_learning=True,
                                    cache_serves=True)  # fmt: skip
    assert compilation.compile_pays(steps, 4 * PAPER_PIXELS, mutual_learning=True,
                                    cache_serves=False)  # fmt: skip
    # the demo's 32 px batches do not repay it (its 10 rounds are ~40 steps a client)
    assert not compilation.compile_pays(1000, 32 * 32 * 32, mutual_learning=True,
                                        cache_serves=True)  # fmt: skip


def test_the_cache_is_the_runs_directory_and_its_markers_name_the_graphs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(compilation.CACHE_ENV, "/tmp/elsewhere")  # inductor's own default
    monkeypatch.delenv(compilation.TRITON_CACHE_ENV, raising=False)
    cache = compilation.use_compile_cache(tmp_path / "cache")
    assert cache == (tmp_path / "cache" / "inductor").resolve() and cache.is_dir()
    assert os.environ[compilation.CACHE_ENV] == str(cache)
    assert os.environ[compilation.TRITON_CACHE_ENV] == str(cache.parent / "triton")
    facts = {"proxy": "resnet18_gn", "chunks": [32, 8], "input_size": 512}
    key = compilation.graph_key(**facts)
    assert key == compilation.graph_key(**dict(reversed(facts.items())))  # order-free
    assert key != compilation.graph_key(**{**facts, "chunks": [24, 8]})
    assert not compilation.cache_serves(cache, key)
    compilation.mark_cached(cache, key, facts)
    assert compilation.cache_serves(cache, key)
    assert not compilation.cache_serves(cache, compilation.graph_key(**{**facts, "proxy": "x"}))
