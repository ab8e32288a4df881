"""The CPU kernels' pin (plumbing.kernels): a job pinned to AVX2 gives the same bytes on
every x86-64 machine with AVX2 or better, and says which kernels it ran with.

The reference is a short ProxyFL job (two clients, two rounds, the demo's cnn1 proxy and
cnn2 private model, DP-SGD) trained pinned on 2026-11-27 on an AMD EPYC with AVX-512
(Zen 5): its metrics and kept models. An AVX2 machine gives them natively as well as
pinned; an AVX-512 machine only pinned.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analysis.audit.membership import resampled_metrics
from plumbing.kernels import PINS, in_effect, main, pinned_environment
from proxyfl.launch.address_exchange import relaunched_on_unequal_addresses
from tests.proxyfl.conftest import (
    PLACEMENT,
    REPO,
    explain,
    mpi_env,
    train_args,
)

X86_64 = platform.machine().lower() in {"x86_64", "amd64"}
# sha256 of metrics.jsonl and of each kept model of the job below, pinned to AVX2
REFERENCE = {
    "metrics.jsonl": "b12cb68cf206e488c459097909600acd48e1e8699c4da2e1451f53fddb4e6853",
    "models/client_0/private.safetensors":
        "be57ec184541b10f39e563077f510c87c8827f2a01b5ba0fb350cf1ddd510e82",
    "models/client_0/proxy.safetensors":
        "214cb5490078a8338ffd52737784ea04eeade2bb8c316813e4c623d9b4ead428",
    "models/client_1/private.safetensors":
        "591e04342aea02262397d27e3901fd77acb408aef1ee5c54372abb68d75f7411",
    "models/client_1/proxy.safetensors":
        "b8f99af169a144c8e99002d4e316e0bb00e8cb0a677b01cf5e46926e30779720",
}  # fmt: skip


def _pinned_job(stores: Path, run_dir: Path, kernels: str) -> dict[str, str]:
    """The job, its ranks started cold with ``kernels``' pin in their environment (as
    ``python -m plumbing.kernels`` leaves it): the sha256 of the files it keeps."""
    args = train_args(stores, run_dir, "ProxyFL", centers=[0, 1], private_model="cnn2",
                      proxy_model="cnn1", rounds=2)  # fmt: skip
    command = [*PLACEMENT.command_prefix(2), sys.executable, "-m", "mpi4py", "-m",
               "proxyfl.run", *args]  # fmt: skip
    environment = pinned_environment(kernels, {k: v for k, v in mpi_env().items()
                                               if k not in PINS["avx2"]})  # fmt: skip
    result = relaunched_on_unequal_addresses(lambda: subprocess.run(
        command, cwd=REPO, env=environment, capture_output=True, text=True, errors="replace",
        timeout=300))  # fmt: skip
    assert result.returncode == 0, explain(result)
    kept = [run_dir / "metrics.jsonl", *sorted((run_dir / "models").rglob("*.safetensors"))]
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest() for p in kept}


@pytest.mark.slow
@pytest.mark.skipif(not X86_64, reason="the pin is x86-64's (another architecture: other bytes)")
def test_a_job_pinned_to_avx2_gives_the_recorded_bytes_and_says_so(
    stores: Path, tmp_path: Path
) -> None:
    pinned = _pinned_job(stores, tmp_path / "pinned", "avx2")
    run = json.loads((tmp_path / "pinned" / "run.json").read_text())
    assert run["cpu_kernels"] == dict(PINS["avx2"])
    assert {c["kernels"] for c in run["clients"]} == {"cpu AVX2, onednn AVX2, 1 thread"}
    assert pinned == REFERENCE, "the pinned job's bytes differ from the recorded ones"

    native = _pinned_job(stores, tmp_path / "native", "native")
    run = json.loads((tmp_path / "native" / "run.json").read_text())
    assert run["cpu_kernels"] == {}
    if {c["kernels"] for c in run["clients"]} == {"cpu AVX2, onednn native, 1 thread"}:
        assert native == REFERENCE  # this machine's best is the pin's


def test_the_command_runs_pinned_and_refuses_what_it_does_not_know(
    capfd: pytest.CaptureFixture[str],
) -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "plumbing.kernels", "avx2", "--", sys.executable, "-c",
         "import json, os; from plumbing.kernels import in_effect; print(json.dumps(in_effect()))"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=60,
        env={**os.environ, "ATEN_CPU_CAPABILITY": "avx512"},  # the configuration wins
    ).stdout  # fmt: skip
    assert json.loads(printed) == dict(PINS["avx2"])
    assert in_effect({"MKL_CBWR": "AVX2", "HOME": "/"}) == {"MKL_CBWR": "AVX2"}
    for argv in (["avx512", "--", "true"], ["avx2", "true"], ["avx2", "--"]):
        with pytest.raises(SystemExit, match=r"usage: python -m plumbing\.kernels"):
            main(argv)
    with pytest.raises(SystemExit, match=r"error: no-such-program-here: No such file"):
        main(["native", "--", "no-such-program-here"])


# the audit's numeric core on fixed logits: every score, then the membership metrics with
# their bootstrap intervals, printed as JSON (float64 bits exactly, as audit.json holds them)
AUDIT_CORE = """
import json
from dataclasses import asdict
import numpy as np
from analysis.audit.membership import membership_result
from analysis.audit.scores import lira_offline, log_likelihood, logit_confidence
rng = np.random.default_rng(7)
logits = rng.normal(0.0, 3.0, (3000, 2)).astype(np.float32)
labels = rng.integers(0, 2, 3000)
reference = np.stack([logit_confidence(logits + rng.normal(0, 0.5, logits.shape)
                                       .astype(np.float32), labels) for _ in range(4)])
out = rng.random((4, 3000)) < 0.5
out[0] = ~out[1:].any(axis=0) | out[0]
scores = {"loss": log_likelihood(logits, labels), "confidence": logit_confidence(logits, labels),
          "lira": lira_offline(logit_confidence(logits, labels), reference, out)}
print(json.dumps({name: {"scores": [float(x).hex() for x in s],
                         "membership": asdict(membership_result(s[:1500], s[1500:],
                                                                bootstrap=50, seed=0))}
                  for name, s in scores.items()}, default=str))
"""


def _numpy_dispatch(environment: dict[str, str]) -> tuple[list[str], str]:
    """The numpy targets enabled under ``environment`` (of those it dispatches), and the
    audit core's output there."""
    enabled = subprocess.run(
        [sys.executable, "-c", "from numpy._core._multiarray_umath import __cpu_dispatch__ as d,"
         " __cpu_features__ as f; print(' '.join(t for t in d if f.get(t)))"],
        env=environment, capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()  # fmt: skip
    core = subprocess.run([sys.executable, "-c", AUDIT_CORE], cwd=REPO, env=environment,
                          capture_output=True, text=True, check=True, timeout=300)  # fmt: skip
    return enabled, core.stdout


@pytest.mark.skipif(not X86_64, reason="the pin is x86-64's (another architecture: other bytes)")
def test_the_audits_numbers_under_the_pin_are_an_avx2_machines() -> None:
    """What an AVX2 machine computes (numpy dispatching nothing above AVX2, every other
    library capped as the pin caps it), this machine computes under the pin: the audit's
    scores, AUC, TPRs and bootstrap intervals, bit for bit. Natively, an AVX-512 machine
    computes other last bits (numpy's float64 exp and log): this test then also shows that
    it can tell them apart."""
    base = {
        k: v for k, v in os.environ.items() if k not in (*PINS["avx2"], "NPY_DISABLE_CPU_FEATURES")
    }
    pinned = pinned_environment("avx2", base)
    from numpy._core._multiarray_umath import __cpu_dispatch__ as targets

    above_avx2 = [t for t in targets if t.startswith("AVX512") or t == "X86_V4"]
    an_avx2_machine = {**pinned, "NPY_DISABLE_CPU_FEATURES": " ".join(above_avx2)}
    enabled, under_pin = _numpy_dispatch(pinned)
    assert not set(enabled) & set(above_avx2), f"the pin leaves numpy {enabled}"
    assert under_pin == _numpy_dispatch(an_avx2_machine)[1]
    native_enabled, native = _numpy_dispatch(base)
    if set(native_enabled) & set(above_avx2):  # an AVX-512 machine: the pin matters
        assert native != under_pin, "natively too the AVX2 bits: the test could not tell"


def test_a_pinned_process_computes_a_float64_product_of_any_inner_dimension() -> None:
    """The pin leaves OpenBLAS its own choice of core: forcing one (``OPENBLAS_CORETYPE=
    Haswell``) crashed OpenBLAS 0.3.34 on AMD Zen 4 and 5 (its Zen blocking overran the
    Haswell kernel's stack buffer beyond an inner dimension of about 300), and the audit
    with it: a (256, 4,096) by (4,096, 256) product, which crashed there every time under
    the old pin, must end in a process the pin starts."""
    product = (
        "import numpy as np; a = np.ones((256, 4096)); b = np.ones((4096, 256)); "
        "assert (a @ b == 4096).all(); print('computed')"
    )
    done = subprocess.run(
        [sys.executable, "-m", "plumbing.kernels", "avx2", "--", sys.executable, "-c", product],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "computed", (
        f"exit {done.returncode}: {done.stderr[-2000:]}"
    )


def test_the_bootstraps_blas_product_is_exact_so_no_blas_core_changes_its_bits() -> None:
    """Why OpenBLAS needs no pin: the audit's one BLAS product (the bootstrap's AUCs,
    wᵀ K u with K of 0, ½ and 1 and integer counts) equals the same sums done in integers
    (numpy's own int64 loops, no BLAS), bit for bit, ties and repeated scores included."""
    rng = np.random.default_rng(3)
    members = np.round(rng.normal(0.3, 1.0, 700), 1)  # rounded: many ties
    non_members = np.round(rng.normal(0.0, 1.0, 900), 1)
    member_counts = rng.multinomial(700, np.full(700, 1 / 700), size=40)
    non_member_counts = rng.multinomial(900, np.full(900, 1 / 900), size=40)
    aucs = resampled_metrics(members, non_members, member_counts, non_member_counts)[:, 0]
    twice_kernel = 2 * (members[:, None] > non_members[None, :]) + (
        members[:, None] == non_members[None, :]
    )
    twice_sums = ((member_counts @ twice_kernel) * non_member_counts).sum(axis=1)
    assert twice_sums.dtype == np.int64
    exact = (twice_sums / 2) / (700 * 900)
    assert aucs.tobytes() == exact.tobytes()
