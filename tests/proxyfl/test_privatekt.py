"""PrivateKT: the pure maths (Lemma 1, Eqs. 2–5), its pools and options, and runs under
real mpiexec.

The MPI runs use two clients (centres 0 and 1). The first pool is the public centre 4,
whose store's ``labels`` datasets are made unreadable (external storage in a file that does
not exist): any read of them fails, so a run that finishes never read the public labels.
The second is the paper's: a share of the clients' own training splits.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from proxyfl.algorithms.privatekt.knowledge import (
    KnowledgeBuffer,
    entropy,
    kt_weights,
    self_training_weights,
    weighted_sample,
)
from proxyfl.algorithms.privatekt.public_pool import PublicPool
from proxyfl.comm.exchange import digest, flatten_parameters
from proxyfl.engine.checkpoint import available_rounds, checkpoint_path, load_checkpoint
from proxyfl.engine.evaluate import evaluate_models
from proxyfl.engine.models import build_model
from proxyfl.engine.runtime import derived_seed
from proxyfl.privacy.ldp import (
    LDPLedger,
    keep_probability,
    one_hot,
    randomized_response,
    unbiased_estimate,
)
from proxyfl.results import MetricRow
from wsi.store.reader import PatchSplitReader
from wsi.store.schema import store_path

CLIENTS = (0, 1)
PUBLIC = 4
ROUNDS = 3
K = 20
# A large ε keeps most labels (β ≈ 0.99), so three rounds are enough to learn the toy task
# with Adam and minibatch fine-tuning; the authors' plain SGD needs many more rounds.
OPTIONS: dict[str, Any] = {
    "rounds": ROUNDS, "centers": list(CLIENTS), "kt_samples": K, "ldp_epsilon": 100.0,
    "buffer_size": 5, "public_pool": "center", "client_fraction": 1.0,
    "kt_optimizer": "adam", "kt_lr": 1e-3, "finetune_batches": "minibatch",
    "kt_local_epochs": 1,
}  # fmt: skip
MARGIN = 0.2


# -- Lemma 1 and Eq. (2): randomized response ------------------------------------------------
def test_beta_is_lemma_1_and_makes_each_round_epsilon_ldp() -> None:
    for epsilon, k, c in [(5.0, 2, 2), (1.0, 10, 10), (0.1, 1, 3), (8.0, 4, 5)]:
        beta = keep_probability(epsilon, k, c)
        assert beta == pytest.approx((math.exp(epsilon / k) - 1) / (math.exp(epsilon / k) - 1 + c))
        # P(ŷ = y | y) / P(ŷ = y | y' ≠ y) = e^{ε/K} per label, e^ε over the K labels
        same, other = beta + (1 - beta) / c, (1 - beta) / c
        assert math.log(same / other) * k == pytest.approx(epsilon)
    with pytest.raises(ValueError):
        keep_probability(0.0, 2, 2)


def test_randomized_response_keeps_a_label_with_probability_beta() -> None:
    epsilon, k, c, n = 5.0, 2, 4, 200_000
    beta = keep_probability(epsilon, k, c)
    rng = np.random.default_rng(1)
    labels = rng.integers(0, c, n)
    out = randomized_response(labels, beta, c, rng)
    assert out.dtype == np.int64 and out.shape == labels.shape
    # P(ŷ = y) = β + (1−β)/C, so β̂ = (rate − 1/C) / (1 − 1/C); 5 standard errors
    rate = float(np.mean(out == labels))
    beta_hat = (rate - 1 / c) / (1 - 1 / c)
    bound = 5 * math.sqrt(rate * (1 - rate) / n) / (1 - 1 / c)
    assert abs(beta_hat - beta) < bound
    # the bound is tight enough to catch the usual mistakes (ε instead of ε/K; C = 1 class)
    for wrong in (keep_probability(epsilon, 1, c), keep_probability(epsilon, k, c - 1)):
        assert abs(beta_hat - wrong) > bound
    # replacements are uniform over all C classes, the original included
    replaced = np.bincount(out[out != labels], minlength=c) / max(1, int(np.sum(out != labels)))
    assert np.allclose(replaced, 1 / c, atol=0.02)


def test_eq3_estimate_is_unbiased() -> None:
    c, beta, trials = 3, keep_probability(2.0, 3, 3), 5_000
    truth = np.array([[0, 1, 2], [0, 2, 2], [1, 1, 2], [0, 0, 2]])  # 4 clients × K = 3 items
    target = one_hot(truth, c).mean(axis=0)  # the clients' mean one-hot prediction
    rng = np.random.default_rng(2)
    total = np.zeros_like(target)
    for _ in range(trials):
        total += unbiased_estimate(randomized_response(truth, beta, c, rng), beta, c)
    mean = total / trials
    # the per-trial standard deviation of one entry is at most 1/(β·sqrt|G|)
    tolerance = 5 / (beta * math.sqrt(truth.shape[0] * trials))
    assert np.abs(mean - target).max() < tolerance
    # a naive mean of the perturbed labels is biased towards 1/C: the test can tell
    naive = one_hot(randomized_response(truth, beta, c, rng), c).mean(axis=0)
    assert np.abs(naive - target).max() > tolerance


def test_ledger_composes_rounds_sequentially() -> None:
    ledger = LDPLedger(epsilon_per_round=5.0)
    assert ledger.epsilon() == 0 and ledger.epsilon_after_next_round() == 5.0
    for _ in range(3):
        ledger.record_release()
    assert ledger.epsilon() == 15.0 and ledger.notion == "label_ldp" and ledger.delta == 0
    restored = LDPLedger(epsilon_per_round=1.0)
    restored.load_state_dict(ledger.state_dict())
    assert restored == ledger


# -- Eqs. (4), (5) and the buffer ------------------------------------------------------------
def test_importance_sampling_prefers_uncertain_items_and_self_training_confident_ones() -> None:
    confident, uncertain = [0.99, 0.01], [0.5, 0.5]
    probabilities = np.array([confident] * 5 + [uncertain] * 5)
    assert entropy(np.array([uncertain]))[0] == pytest.approx(math.log(2))
    kt, st = kt_weights(probabilities), self_training_weights(probabilities)
    assert kt.sum() == pytest.approx(1) and st.sum() == pytest.approx(1)
    assert kt[5:].min() > kt[:5].max() and st[:5].min() > st[5:].max()
    u = entropy(probabilities)
    assert kt[5] / kt[0] == pytest.approx(math.exp(u[5] - u[0]))  # ∝ exp(u), Eq. 4
    assert st[0] / st[5] == pytest.approx(math.exp(u[5] - u[0]))  # ∝ exp(−u), Eq. 5
    rng = np.random.default_rng(3)
    kt_draws = np.concatenate([weighted_sample(kt, 2, rng) for _ in range(1000)])
    st_draws = np.concatenate([weighted_sample(st, 2, rng) for _ in range(1000)])
    assert np.mean(kt_draws >= 5) > 0.55 and np.mean(st_draws < 5) > 0.55
    assert all(len(set(weighted_sample(kt, 10, rng))) == 10 for _ in range(5))  # distinct


def test_knowledge_buffer_is_fifo_of_b_rounds() -> None:
    buffer = KnowledgeBuffer(2)
    for round_number, estimate in enumerate([[0.1, 0.9], [0.3, 0.7], [0.6, 0.4]]):
        buffer.push(np.array([round_number]), np.array([estimate]))
    items, labels = buffer.targets()
    assert items.tolist() == [1, 2] and labels.tolist() == [1, 0]
    restored = KnowledgeBuffer(1)
    restored.load_state_dict(buffer.state_dict())
    assert restored.targets()[0].tolist() == [1, 2]


# -- under mpiexec ---------------------------------------------------------------------------
def hide_labels(path: Path) -> None:
    """Replace a store's label datasets by ones whose data cannot be read (same shape)."""
    with h5py.File(path, "r+") as h5:
        for split in ("train", "test"):
            n = h5[split]["labels"].shape[0]
            del h5[split]["labels"]
            missing = str(path.parent / f"absent_{split}.bin")
            h5[split].create_dataset("labels", shape=(n,), dtype=np.int64,
                                     external=[(missing, 0, 8 * n)])  # fmt: skip


@pytest.fixture(scope="module")
def data(helpers: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = helpers.write_stores(
        tmp_path_factory.mktemp("privatekt"), (*CLIENTS, PUBLIC), n_train=40, n_test=20, seed=5
    )
    hide_labels(store_path(directory, PUBLIC))
    return directory


@pytest.fixture(scope="module")
def run_dir(helpers: Any, data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "PrivateKT"
    result = helpers.run_mpi(len(CLIENTS), helpers.train_args(data, out, "PrivateKT", **OPTIONS))
    assert result.returncode == 0, helpers.explain(result)
    return out


def _record(run_dir: Path, rank: int) -> dict[str, Any]:
    return json.loads((run_dir / "ranks" / f"rank_{rank}.json").read_text())


def _opened(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    """The files rank ``rank`` opened (its machine record: paths as this machine names them)."""
    machine = json.loads((run_dir / "ranks" / f"rank_{rank}.machine.json").read_text())
    return list(machine["opened"])


def test_public_labels_are_unreadable_and_the_pool_never_reads_them(data: Path) -> None:
    path = store_path(data, PUBLIC)
    with pytest.raises(Exception, match="external"):
        PatchSplitReader(path, "train")  # a reader that loads labels fails on this store
    pool = PublicPool.of_center(data, PUBLIC)
    assert len(pool) == 60 and pool.images([0, 59]).shape == (2, 16, 16, 3)
    assert np.array_equal(pool.images([59, 0]), pool.images([0, 59])[::-1])


@pytest.mark.slow  # an MPI job
def test_every_round_records_every_client_with_label_ldp(helpers: Any, run_dir: Path) -> None:
    rows = helpers.read_jsonl(run_dir / "metrics.jsonl")
    assert {(r["client"], r["round"]) for r in rows} == {
        (c, t) for c in range(len(CLIENTS)) for t in range(1, ROUNDS + 1)
    }
    assert len(rows) == len(CLIENTS) * ROUNDS
    for row in rows:
        MetricRow.model_validate(row)
        assert row["algorithm"] == "PrivateKT" and row["evaluated_model"] == "central"
        assert row["primary"] and row["privacy_notion"] == "label_ldp" and row["delta"] == 0
        assert row["epsilon_per_round"] == 100.0
        assert row["epsilon"] == pytest.approx(100.0 * row["round"])  # t·ε, all selected
    for round_number in range(1, ROUNDS + 1):  # one global model: the same scores everywhere
        assert len({r["accuracy"] for r in rows if r["round"] == round_number}) == 1
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "finished" and run["config"]["kt_samples"] == K
    for client in map(str, range(len(CLIENTS))):
        privacy = run["privacy"][client]
        assert privacy["notion"] == "label_ldp" and privacy["epsilon"] == 100.0 * ROUNDS
        assert run["epsilon"][client] == privacy["epsilon"]
        assert "shuffl" in privacy["assumption_not_computed"]


@pytest.mark.slow  # an MPI job
def test_a_client_sends_nothing_but_k_labels(run_dir: Path, data: Path) -> None:
    for rank in range(len(CLIENTS)):
        record = _record(run_dir, rank)
        public = [o for o in _opened(run_dir, rank)
                  if Path(o["path"]).name == f"center_{PUBLIC}.h5"]  # fmt: skip
        assert public and all(o.get("images_only") for o in public)
        if rank == 0:  # the server: the global model, the selection and the KT item indices
            kinds = {e["kind"] for e in record["sent"]}
            assert kinds == {"global_model", "selection", "kt_items"}
            for entry in record["sent"]:
                expected = {"global_model": record["proxy_parameters"], "kt_items": K,
                            "selection": len(CLIENTS)}[entry["kind"]]  # fmt: skip
                assert entry["values"] == expected and entry["peer"] == "all"
            continue
        sent = record["sent"]
        assert [e["round"] for e in sent] == list(range(1, ROUNDS + 1))
        for entry in sent:
            assert (entry["kind"], entry["peer"], entry["values"], entry["dtype"]) == (
                "labels",
                0,
                K,
                "int64",
            )
        state = load_checkpoint(run_dir, rank, ROUNDS)
        model = build_model("cnn1", 2, 16)
        model.load_state_dict(state["shared_model"])
        assert digest(flatten_parameters(model)) not in {e["digest"] for e in sent}


@pytest.mark.slow  # an MPI job
def test_global_model_learns_from_the_clients_labels(
    helpers: Any, run_dir: Path, data: Path
) -> None:
    """Fails for a no-op: the final global model must beat its own initialisation."""
    torch.manual_seed(derived_seed(0, "shared-init"))
    initial = build_model("cnn1", 2, 16)
    tests = [PatchSplitReader(store_path(data, c), "test") for c in CLIENTS]
    before = evaluate_models({"m": initial}, tests, 2, torch.device("cpu"), 16)["m"].accuracy
    labels = np.concatenate([t.labels for t in tests])
    majority = float(np.bincount(labels).max() / len(labels))
    rows = helpers.read_jsonl(run_dir / "metrics.jsonl")
    after = min(r["accuracy"] for r in rows if r["round"] == ROUNDS)
    assert after >= max(before, majority) + MARGIN, (before, majority, after)
    final = load_checkpoint(run_dir, 0, ROUNDS)["shared_model"]
    assert any(not torch.equal(final[k], v) for k, v in initial.state_dict().items())


@pytest.mark.slow  # an MPI job
def test_resumed_from_a_checkpoint_matches_uninterrupted(
    helpers: Any, data: Path, run_dir: Path, tmp_path: Path
) -> None:
    """A copy of the finished run cut back to its round-2 checkpoints (as a run killed after
    round 2 leaves them) resumes in fresh processes to the same round 3."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    for rank in range(len(CLIENTS)):
        assert available_rounds(copy, rank) == [ROUNDS - 1, ROUNDS]
        checkpoint_path(copy, rank, ROUNDS).unlink()
    # a moved run directory resumes: where a run is is not part of its configuration
    args = helpers.train_args(data, copy, "PrivateKT", **OPTIONS)
    resumed = helpers.run_mpi(len(CLIENTS), [*args, "--resume"])
    assert resumed.returncode == 0, helpers.explain(resumed)
    assert f"resuming after round {ROUNDS - 1}" in resumed.stderr

    def rows(path: Path) -> list[dict[str, Any]]:
        return helpers.read_jsonl(path / "metrics.jsonl")

    assert rows(copy) == rows(run_dir)
    for rank in range(len(CLIENTS)):
        a, b = load_checkpoint(run_dir, rank, ROUNDS), load_checkpoint(copy, rank, ROUNDS)
        assert all(
            torch.equal(a["shared_model"][k], b["shared_model"][k]) for k in a["shared_model"]
        )
        assert (
            a["accountant"] == b["accountant"] == {"epsilon_per_round": 100.0, "releases": ROUNDS}
        )
        assert a["exchange"]["rr_rng"] == b["exchange"]["rr_rng"]
    server_a, server_b = (
        load_checkpoint(d, 0, ROUNDS)["exchange"]["server"] for d in (run_dir, copy)
    )
    assert np.array_equal(server_a["kt_items"], server_b["kt_items"])
    assert server_a["rng"] == server_b["rng"]
    assert [e[0].tolist() for e in server_a["buffer"]["entries"]] == [
        e[0].tolist() for e in server_b["buffer"]["entries"]
    ]


BAD = {
    "no public store": ({"public_center": 3}, "no store"),
    "K larger than the pool": ({"kt_samples": 61}, "larger than the 60 items of the public pool"),
    "epsilon not positive": ({"ldp_epsilon": 0}, "ldp_epsilon"),
    "K larger than the share pool": (  # 2 x int(0.2 x 40) = 16 held-out items
        {"public_pool": "share", "kt_samples": 17},
        "larger than the 16 items of the public pool (a share 0.2 of centres [0, 1]'",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_a_clear_error_on_all_ranks(
    helpers: Any, data: Path, tmp_path: Path, case: str
) -> None:
    settings, message = BAD[case]
    args = helpers.train_args(data, tmp_path / "run", "PrivateKT", **{**OPTIONS, **settings})
    result = helpers.run_mpi(len(CLIENTS), args, timeout=120)
    assert result.returncode == 2, helpers.explain(result)
    errors = [line for line in result.stderr.splitlines() if "proxyfl.run: error:" in line]
    assert len(errors) == 1 and message in errors[0], helpers.explain(result)
    if case != "epsilon not positive":  # found by every rank's store check
        assert "ranks 0 (centre 0), 1 (centre 1):" in errors[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_rows_written_before_privatekt_load_as_sample_level_dp() -> None:
    old = {
        "algorithm": "FedAvg", "seed": 0, "client": 1, "round": 2, "accuracy": 0.8,
        "macro_accuracy": 0.8, "epsilon": 1.4, "delta": 1e-5, "train_loss": 0.4,
        "comm_seconds": 0.1, "evaluated_model": "central", "center": 1, "primary": True,
        "active": True, "n_train": 476,
    }  # fmt: skip
    row = MetricRow.model_validate(old)
    assert (row.privacy_notion, row.epsilon_per_round) == ("sample_dp", None)
    with pytest.raises(ValueError, match="privacy_notion"):
        MetricRow.model_validate({**old, "privacy_notion": "patient_dp"})


def test_ablations_and_client_fraction_map_to_the_settings() -> None:
    from proxyfl.algorithms.privatekt.strategy import KTSettings, selection_size
    from proxyfl.config import TrainConfig

    base = KTSettings.from_config(TrainConfig(algorithm="PrivateKT"), n_classes=2, pool_size=95)
    assert (base.kt_samples, base.ldp_epsilon, base.buffer_size) == (2, 5.0, 25)
    assert base.self_train_samples == 10 and not base.uniform_sampling  # ⌈0.1 · 95⌉
    assert base.beta == pytest.approx(math.expm1(2.5) / (math.expm1(2.5) + 2))
    ablated = KTSettings.from_config(
        TrainConfig(algorithm="PrivateKT", buffer=False, self_training=False,
                    uniform_sampling=True),
        n_classes=2, pool_size=95,
    )  # fmt: skip
    assert (ablated.buffer_size, ablated.self_train_samples, ablated.uniform_sampling) == (
        1, 0, True,
    )  # fmt: skip
    assert [selection_size(f, 4) for f in (1.0, 0.5, 0.1)] == [4, 2, 1]
    # int(fraction · n) as the authors' code, never round(): 0.5 of 3 clients is 1
    assert [selection_size(0.5, n) for n in (1, 2, 3, 5)] == [1, 1, 1, 2]
    assert selection_size(0.5, 0) == 0
    authors = KTSettings.from_config(TrainConfig(algorithm="PrivateKT"), 2, 95)
    assert (authors.client_fraction, authors.finetune_full_batch, authors.fresh_optimizer,
            authors.uniform_first_items) == (0.5, True, True, False)  # fmt: skip
    algorithm_1 = KTSettings.from_config(
        TrainConfig(algorithm="PrivateKT", first_kt_items="uniform"), 2, 95
    )
    assert algorithm_1.uniform_first_items and not algorithm_1.uniform_sampling


def _mean_entropy(probabilities: np.ndarray) -> float:
    return float(-(probabilities * np.log(probabilities + 1e-12)).sum(axis=-1).mean())


def test_soft_self_training_keeps_the_guesses_and_argmax_sharpens_them(data: Path) -> None:
    """Self-training on the model's own predictions of every public item: with its
    probabilities as targets (the default, the authors' code) the predictions stay near
    where they were; with its argmax labels the model grows surer of each guess, which is
    what pulls a model near chance towards one class."""
    from proxyfl.algorithms.privatekt.strategy import PublicItems

    items = PublicItems(PublicPool.of_center(data, PUBLIC), torch.device("cpu"), 16)
    everything = np.arange(len(items.pool))
    change = {}
    for targets in ("soft", "argmax"):
        torch.manual_seed(3)
        model = build_model("cnn1", 2, 16)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        before = items.probabilities(model, None, 64)
        own = before if targets == "soft" else before.argmax(axis=-1)
        items.fit(model, optimizer, everything, own, epochs=3, batch_size=16,
                  rng=np.random.default_rng(0))  # fmt: skip
        after = items.probabilities(model, None, 64)
        change[targets] = (_mean_entropy(before) - _mean_entropy(after),
                           float(np.abs(after - before).max()))  # fmt: skip
    sharpened, moved = change["argmax"]
    assert sharpened > 0.1, change  # argmax: the entropy falls
    assert abs(change["soft"][0]) < sharpened / 3 and change["soft"][1] < moved, change


# -- the paper's pool: a share of the clients' training splits --------------------------------
def test_held_out_rows_are_the_share_of_a_seeded_permutation() -> None:
    from proxyfl.algorithms.privatekt.public_pool import held_out_rows, kept_rows

    rows = held_out_rows(103, 0.2, seed=7, center=1)
    assert len(rows) == 20 and np.all(np.diff(rows) > 0) and rows.max() < 103
    assert np.array_equal(rows, held_out_rows(103, 0.2, seed=7, center=1))  # every rank agrees
    assert not np.array_equal(rows, held_out_rows(103, 0.2, seed=7, center=2))
    kept = kept_rows(103, rows)
    assert (
        len(kept) == 83 and not set(kept) & set(rows) and set(kept) | set(rows) == set(range(103))
    )
    with pytest.raises(ValueError):
        held_out_rows(10, 1.0, seed=0, center=0)


def test_the_share_pool_reads_no_label_and_the_clients_no_longer_train_on_it(
    helpers: Any, tmp_path: Path
) -> None:
    from proxyfl.algorithms.privatekt.public_pool import held_out_rows, kept_rows
    from proxyfl.engine.access import AccessLog
    from proxyfl.engine.data import PatchDataset

    directory = helpers.write_stores(tmp_path / "s", CLIENTS, n_train=40, n_test=4, seed=9)
    readers = {c: PatchSplitReader(store_path(directory, c), "train") for c in CLIENTS}
    images = {c: readers[c].images(slice(0, 40)) for c in CLIENTS}
    held = {c: held_out_rows(40, 0.25, seed=3, center=c) for c in CLIENTS}
    for c in CLIENTS:  # from here on, any read of a client's labels fails
        readers[c].close()
        hide_labels(store_path(directory, c))
    log = AccessLog()
    pool = PublicPool.held_out_shares(directory, CLIENTS, 0.25, seed=3, log=log)
    assert len(pool) == 20
    expected = np.concatenate([images[c][held[c]] for c in CLIENTS])
    assert np.array_equal(pool.images(np.arange(20)), expected)
    assert all(entry["images_only"] and entry["split"] == "train" for entry in log.opened)

    clean = helpers.write_stores(tmp_path / "clean", CLIENTS, n_train=40, n_test=4, seed=9)
    own = PatchSplitReader(store_path(clean, 0), "train")
    dataset = PatchDataset([own], [kept_rows(40, held[0])])
    assert len(dataset) == 30 and np.array_equal(dataset.labels, own.labels[kept_rows(40, held[0])])
    trained_on = {bytes(np.asarray(x).tobytes()) for x, _ in (dataset[i] for i in range(30))}
    public = {bytes(np.ascontiguousarray(img.transpose(2, 0, 1)).tobytes())
              for img in pool.images(np.arange(10))}  # centre 0's held-out rows  # fmt: skip
    assert len(public) == 10 and not trained_on & public


def test_a_fresh_optimizer_steps_as_a_new_one() -> None:
    from proxyfl.algorithms.privatekt.strategy import forget_state, make_optimizer
    from proxyfl.config import TrainConfig

    config = TrainConfig(algorithm="PrivateKT", kt_optimizer="adam", kt_lr=0.1)
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 2, (8,))

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    torch.manual_seed(0)
    used = build_model("cnn1", 2, 16)
    optimizer = make_optimizer(used, config)
    step(used, optimizer)
    start = {k: v.clone() for k, v in used.state_dict().items()}
    forget_state(optimizer)
    assert not optimizer.state
    step(used, optimizer)
    fresh = build_model("cnn1", 2, 16)
    fresh.load_state_dict(start)
    step(fresh, make_optimizer(fresh, config))
    after, expected = used.state_dict(), fresh.state_dict()
    assert all(torch.equal(after[key], expected[key]) for key in after)
    assert isinstance(make_optimizer(used, TrainConfig()), torch.optim.SGD)  # the authors'


@pytest.mark.slow  # an MPI job
def test_a_share_pool_run_trains_on_the_rest_with_a_fresh_optimizer_each_round(
    helpers: Any, data: Path, tmp_path: Path
) -> None:
    """The paper's pool and the authors' defaults (half the clients a round, 5 local
    epochs, fresh state), with Adam so that the state has something to forget."""
    options = {"rounds": ROUNDS, "centers": list(CLIENTS), "kt_samples": 4,
               "kt_optimizer": "adam", "kt_lr": 0.01, "batch_size": 8}  # fmt: skip
    out = tmp_path / "share"
    result = helpers.run_mpi(len(CLIENTS), helpers.train_args(data, out, "PrivateKT", **options))
    assert result.returncode == 0, helpers.explain(result)
    rows = helpers.read_jsonl(out / "metrics.jsonl")
    assert {r["n_train"] for r in rows} == {40 - 8}  # 20 % of 40 held out per client
    # one client of two per round: each round's ε grows for exactly one client
    final = [r["epsilon"] for r in rows if r["round"] == ROUNDS]
    assert sum(final) == pytest.approx(5.0 * ROUNDS)
    steps_per_round = 5 * math.ceil(32 / 8)
    for rank in range(len(CLIENTS)):
        opened = _opened(out, rank)
        other = [o for o in opened if o["split"] == "train"
                 and Path(o["path"]).name != f"center_{CLIENTS[rank]}.h5"]  # fmt: skip
        assert other and all(o.get("images_only") for o in other)  # the pool: images only
        assert not any(Path(o["path"]).name == f"center_{PUBLIC}.h5" for o in opened)
        state = load_checkpoint(out, rank, ROUNDS)["shared_optimizer"]["state"]
        steps = {int(s["step"]) for s in state.values()}
        assert steps <= {steps_per_round}, steps  # never more than one round's steps
    timings = json.loads((out / "machine.json").read_text())["timings"]
    server = timings["per_rank"][0]
    assert server["server_finetune_seconds"] > 0 and server["server_sampling_seconds"] > 0
    for rank, spent in enumerate(timings["per_rank"]):  # every phase accounted, within wall
        assert spent["setup_seconds"] > 0 and spent["records_seconds"] > 0
        # the rank's clock starts after its start-up (the interpreter, imports, MPI)
        on_its_clock = sum(spent.values()) - spent["startup_seconds"]
        assert on_its_clock <= timings["wall_seconds_per_rank"][rank] + 0.5


def test_a_batch_larger_than_a_client_s_data_is_all_of_it_for_privatekt_only(
    data: Path, tmp_path: Path
) -> None:
    """Twenty non-IID clients leave some with fewer items than a batch: PrivateKT's
    shuffled mini-batches then take all of them in one (as the authors' DataLoader does);
    Poisson (DP) batches cannot, and are refused."""
    from proxyfl.config import TrainConfig
    from proxyfl.engine.local_training import make_plain
    from proxyfl.engine.validation import SetupError
    from proxyfl.rank_inputs import check_stores

    options = {**OPTIONS, "data": data, "run_dir": tmp_path / "run", "batch_size": 41}
    plan = check_stores(TrainConfig(algorithm="PrivateKT", **options), 0, len(CLIENTS))
    assert plan.client == 0
    with pytest.raises(SetupError, match="41 is larger than the 40 training patches"):
        check_stores(TrainConfig(algorithm="FedAvg", **options), 0, len(CLIENTS))
    items = torch.utils.data.TensorDataset(torch.arange(40.0))
    model = torch.nn.Linear(1, 1)
    training = make_plain(model, torch.optim.SGD(model.parameters(), lr=0.1), items,
                          batch_size=41, generator=torch.Generator().manual_seed(0))  # fmt: skip
    batches = [batch for (batch,) in training.loader]
    assert training.steps_per_epoch == 1 and len(batches) == 1
    assert sorted(batches[0].tolist()) == list(range(40))
