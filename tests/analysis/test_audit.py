"""The privacy audit: attack scores against brute force, ROC figures against scikit-learn,
the one-run bound against the paper's numbers and an exactly ε-DP mechanism, canary plans,
and attacks on models trained here with and without DP (real Opacus)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score, roc_curve
from torch.utils.data import TensorDataset

from analysis.audit.membership import auc, membership_result, resampled_metrics, tpr_at_fpr
from analysis.audit.one_run import audit_canaries, epsilon_lower_bound, p_value
from analysis.audit.options import AuditOptions
from analysis.audit.population import AuditInputError
from analysis.audit.references import (
    ReferenceRecipe,
    balanced_halves,
    train_reference,
)
from analysis.audit.runs import (
    AuditViolation,
    audit_canary_run,
    audit_document,
    audit_training_run,
    summary_lines,
    violations,
)
from analysis.audit.scores import lira_offline, log_likelihood, logit_confidence
from proxyfl.canaries import CanaryPlan, CanaryPlanError
from proxyfl.config import TrainConfig
from proxyfl.engine.data import prepare_images
from proxyfl.engine.models import build_model
from proxyfl.engine.trained import CLASSES, NORMALISATION, ModelCard, save_trained
from proxyfl.kept import trained_path
from proxyfl.privacy.accounting import planned_epsilon
from proxyfl.privacy.dp import make_private
from tests.proxyfl.conftest import make_split, write_stores
from wsi.store.reader import PatchSplitReader
from wsi.store.schema import StoreAttrs, store_path
from wsi.store.writer import write_patch_store

# -- scores --------------------------------------------------------------------------------


def test_scores_are_the_log_likelihood_and_the_logit_of_the_true_class() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, size=(50, 4))
    labels = rng.integers(0, 4, size=50)
    log_p = torch.log_softmax(torch.from_numpy(logits), dim=1).numpy()[np.arange(50), labels]
    np.testing.assert_allclose(log_likelihood(logits, labels), log_p, rtol=1e-12)
    p = np.exp(log_p)
    np.testing.assert_allclose(logit_confidence(logits, labels), np.log(p / (1 - p)), rtol=1e-9)
    # a confident model: p_y rounds to 1 in float64, φ stays finite and ordered
    sure = np.array([[60.0, 0.0], [80.0, 0.0]])
    phi = logit_confidence(sure, np.array([0, 0]))
    assert np.isfinite(phi).all() and phi[1] > phi[0] and phi[0] == pytest.approx(60.0)


def test_lira_offline_ranks_by_the_distance_from_the_out_models() -> None:
    out_models = np.array([[0.0, 5.0, 1.0], [2.0, 7.0, 1.0], [9.0, 9.0, 9.0]])
    out_mask = np.array([[True, True, True], [True, True, True], [False, False, False]])
    target = np.array([3.0, 6.0, 1.0])  # +2 above its OUT mean, 0, 0
    scores = lira_offline(target, out_models, out_mask)
    assert scores[0] > scores[1] == pytest.approx(scores[2])
    # the IN model (row 2) is left out: its 9s change nothing
    assert scores[1] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="no OUT reference"):
        lira_offline(target, out_models, np.zeros_like(out_mask))


def test_reference_halves_put_every_example_out_of_half_the_models() -> None:
    halves = balanced_halves(4, 101, seed=3)
    assert halves.shape == (4, 101) and (halves.sum(axis=0) == 2).all()
    assert np.array_equal(halves, balanced_halves(4, 101, seed=3))
    assert not np.array_equal(halves, balanced_halves(4, 101, seed=4))
    with pytest.raises(ValueError, match="pairs"):
        balanced_halves(3, 10, seed=0)


# -- ROC figures ---------------------------------------------------------------------------


def test_auc_and_tpr_at_low_fpr_agree_with_scikit_learn() -> None:
    rng = np.random.default_rng(1)
    for _ in range(100):
        members = np.round(rng.normal(0.4, 1, rng.integers(1, 200)), 1)  # ties included
        non_members = np.round(rng.normal(0, 1, rng.integers(1, 400)), 1)
        truth = np.r_[np.ones(len(members)), np.zeros(len(non_members))]
        scores = np.r_[members, non_members]
        assert auc(members, non_members) == pytest.approx(roc_auc_score(truth, scores), abs=1e-12)
        fpr, tpr, _ = roc_curve(truth, scores, drop_intermediate=False)
        for level in (0.0, 0.001, 0.01, 0.1, 0.5, 1.0):
            expected = tpr[fpr <= level + 1e-12].max()
            assert tpr_at_fpr(members, non_members, level) == pytest.approx(expected, abs=1e-12)


def test_membership_result_separates_and_reports_chance_as_chance() -> None:
    rng = np.random.default_rng(2)
    apart = membership_result(rng.normal(5, 1, 300), rng.normal(-5, 1, 300),
                              bootstrap=200, seed=0)  # fmt: skip
    assert apart.auc == 1.0 and apart.tpr_at_1pct_fpr == 1.0 and apart.tpr_at_0_1pct_fpr == 1.0
    same = membership_result(rng.normal(0, 1, 2000), rng.normal(0, 1, 1000), bootstrap=300,
                             seed=0)  # fmt: skip
    # chance: AUC ≈ 0.5 ± 1.96 · 0.011 (Hanley–McNeil), the interval about that wide
    assert abs(same.auc - 0.5) < 0.035
    assert same.auc_interval.low <= same.auc <= same.auc_interval.high
    assert 0.025 < same.auc_interval.high - same.auc_interval.low < 0.06
    assert same.n_members == 2000 and len(same.roc_fpr) == len(same.roc_tpr) == 101
    with pytest.raises(ValueError, match="members and non-members"):
        membership_result(np.array([]), np.ones(3), bootstrap=10, seed=0)


def test_resampled_metrics_are_those_of_the_repeated_scores() -> None:
    """The vectorised bootstrap against brute force: each resample's scores repeated by
    their counts, then :func:`auc` and :func:`tpr_at_fpr` on them."""
    rng = np.random.default_rng(5)
    members = np.round(rng.normal(0.5, 1, 60), 1)
    non_members = np.round(rng.normal(0, 1, 250), 1)  # ties, and 0.1 % FPR above 1/n
    counts_m = rng.multinomial(60, np.full(60, 1 / 60), size=40)
    counts_n = rng.multinomial(250, np.full(250, 1 / 250), size=40)
    fast = resampled_metrics(members, non_members, counts_m, counts_n)
    for b in range(40):
        m, n = np.repeat(members, counts_m[b]), np.repeat(non_members, counts_n[b])
        expected = [auc(m, n), tpr_at_fpr(m, n, 0.01), tpr_at_fpr(m, n, 0.001)]
        np.testing.assert_allclose(fast[b], expected, atol=1e-12)
        assert fast[b, 0] == expected[0]  # the AUC exactly: sums of halves, any order


def test_bootstrap_intervals_are_reproducible_from_their_seed() -> None:
    rng = np.random.default_rng(3)
    members, non_members = rng.normal(0.5, 1, 80), rng.normal(0, 1, 80)
    first = membership_result(members, non_members, bootstrap=100, seed=5)
    assert first == membership_result(members, non_members, bootstrap=100, seed=5)
    assert first.auc_interval != membership_result(members, non_members, bootstrap=100,
                                                   seed=6).auc_interval  # fmt: skip
    assert first.auc_interval.low <= first.auc <= first.auc_interval.high


# -- the one-run bound ---------------------------------------------------------------------


def test_one_run_bound_reproduces_the_papers_numbers() -> None:
    """Steinke et al. (2023): 1,000 canaries, 100 guesses, 75 right, δ = 1e-4 → 0.673
    (Appendix D); 100,000 canaries, 1,510 guesses, 1,439 right, δ = 1e-5 → 2.675 (§7)."""
    assert epsilon_lower_bound(1000, 100, 75, 1e-4, 0.05) == pytest.approx(0.673, abs=5e-4)
    assert epsilon_lower_bound(100_000, 1510, 1439, 1e-5, 0.05) == pytest.approx(2.675, abs=1e-3)
    # pure DP: the binomial tail alone, a little higher
    assert epsilon_lower_bound(1000, 100, 75, 0.0, 0.05) == pytest.approx(0.7022, abs=5e-4)
    assert p_value(1000, 100, 50, 0.0, 0.0) > 0.05  # chance level: no bound
    assert epsilon_lower_bound(1000, 100, 50, 1e-5) == 0.0


def test_one_run_bound_holds_for_an_exactly_dp_mechanism() -> None:
    """Randomized response on each canary's coin is exactly ε-DP: each guess is right with
    probability e^ε / (1 + e^ε). The 95 % bound must exceed ε in at most ~5 % of runs."""
    rng = np.random.default_rng(4)
    epsilon, m, trials = 1.0, 200, 400
    q = math.exp(epsilon) / (1 + math.exp(epsilon))
    above = sum(epsilon_lower_bound(m, m, int(rng.binomial(m, q)), 0.0, 0.05) > epsilon
                for _ in range(trials))  # fmt: skip
    assert above <= 0.05 * trials + 3 * math.sqrt(0.05 * 0.95 * trials), above
    # and it has power: the bounds of those runs sit near, below, ε
    bounds = [epsilon_lower_bound(m, m, int(rng.binomial(m, q)), 0.0, 0.05) for _ in range(50)]
    assert 0.4 < float(np.median(bounds)) < epsilon


def test_canary_guesses_top_and_bottom_with_bonferroni() -> None:
    coins = np.r_[np.ones(128, dtype=bool), np.zeros(128, dtype=bool)]
    perfect = audit_canaries(coins.astype(float), coins, [16, 32, 64], delta=1e-5)
    assert perfect.guesses == 128 and perfect.correct == 128
    # 128 of 128 right: the bound of k = 64 at β = 0.05 / 3
    assert perfect.epsilon_lower_bound == pytest.approx(
        epsilon_lower_bound(256, 128, 128, 1e-5, 0.05 / 3), rel=1e-9
    )
    assert perfect.epsilon_lower_bound > 3
    random = audit_canaries(np.random.default_rng(0).normal(size=256), coins, [16, 32, 64], 1e-5)
    assert random.epsilon_lower_bound < 0.5


# -- canary plans --------------------------------------------------------------------------


def test_canary_plan_is_seeded_recorded_and_applied(tmp_path: Path) -> None:
    stored = {0: np.arange(60) % 2, 3: np.arange(80) % 2}
    plan = CanaryPlan.draw(stored, count=20, n_classes=2, patch_size=8, seed=7)
    assert plan.kind == "noise"
    assert plan == CanaryPlan.draw(stored, count=20, n_classes=2, patch_size=8, seed=7)
    assert plan != CanaryPlan.draw(stored, count=20, n_classes=2, patch_size=8, seed=8)
    path = tmp_path / "canaries.json"
    path.write_text(plan.to_json())
    assert CanaryPlan.read(path) == plan
    canaries = plan.centers[3]
    assert 4 <= sum(canaries.included) <= 16 and set(canaries.labels) == {0, 1}
    # noise: the centre's rows all trained on, the IN canaries' pixels added with their labels
    images = plan.noise_images(3)
    assert images.shape == (20, 8, 8, 3) and images.dtype == np.uint8
    assert np.array_equal(images, CanaryPlan.read(path).noise_images(3))
    assert not np.array_equal(images, plan.noise_images(0))
    data = plan.training_data(3, stored[3])
    inside = np.asarray(canaries.included)
    assert np.array_equal(data.rows, np.arange(80)) and np.array_equal(data.labels, stored[3])
    assert np.array_equal(data.extra_images, images[inside])
    assert data.extra_labels.tolist() == np.asarray(canaries.labels)[inside].tolist()
    # flipped: rows of the split, the other class; IN rows relabelled, OUT rows left out
    flipped = CanaryPlan.draw(stored, count=20, n_classes=2, patch_size=8, seed=7,
                              kind="flipped")  # fmt: skip
    canaries = flipped.centers[3]
    assert len(set(canaries.rows)) == 20
    assert all(label != stored[3][row] for row, label in zip(canaries.rows, canaries.labels,
                                                              strict=True))  # fmt: skip
    data = flipped.training_data(3, stored[3])
    out = {row for row, inside in zip(canaries.rows, canaries.included, strict=True) if not inside}
    assert set(data.rows) == set(range(80)) - out and data.extra_images is None
    given = dict(zip(data.rows.tolist(), data.labels.tolist(), strict=True))
    for row, inside, label in zip(canaries.rows, canaries.included, canaries.labels, strict=True):
        assert (given.get(row) == label) if inside else row not in given
    with pytest.raises(CanaryPlanError, match="centre 0: 70 canaries"):
        CanaryPlan.draw(stored, count=70, n_classes=2, patch_size=8, seed=0, kind="flipped")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(CanaryPlanError, match=r"bad\.json: not a canary plan"):
        CanaryPlan.read(tmp_path / "bad.json")


def test_the_canary_runs_training_set_holds_its_in_canaries(
    tmp_path: Path, few_patches: Path
) -> None:
    """``proxyfl.run``'s dataset for a canary run: the split's rows, then the IN noise
    canaries with their labels; none of the OUT ones."""
    from proxyfl.engine.data import PatchDataset

    config = TrainConfig(algorithm="Regular", data=few_patches, run_dir=tmp_path / "run",
                         centers=[0], canaries=tmp_path / "canaries.json")  # fmt: skip
    reader = PatchSplitReader(store_path(few_patches, 0), "train")
    plan = CanaryPlan.draw({0: np.asarray(reader.labels)}, count=10, n_classes=2,
                           patch_size=16, seed=1)  # fmt: skip
    (tmp_path / "canaries.json").write_text(plan.to_json())
    from proxyfl.rank_inputs import StorePlan, open_client_data

    store_plan = StorePlan(client=0, center=0, train_centers=[0], test_centers=[0],
                           n_classes=2, patch_size=16)  # fmt: skip
    dataset = open_client_data(config, store_plan).train
    inside = np.asarray(plan.centers[0].included)
    assert isinstance(dataset, PatchDataset)
    assert len(dataset) == len(reader) + inside.sum()
    batch = dataset.__getitems__(list(range(len(reader) - 1, len(dataset))))
    images = plan.noise_images(0)[inside]
    for (image, label), expected, given in zip(batch[1:], images,
                                               np.asarray(plan.centers[0].labels)[inside],
                                               strict=True):  # fmt: skip
        assert np.array_equal(image.numpy().transpose(1, 2, 0), expected)
        assert int(label) == given
    image, label = dataset[len(dataset) - 1]
    assert np.array_equal(image.numpy().transpose(1, 2, 0), images[-1])


# -- attacks on models trained here --------------------------------------------------------


def _run_dir(
    root: Path, data: Path, models: dict[str, torch.nn.Module], epsilon: float | None,
    *, status: str = "finished", algorithm: str = "ProxyFL",
) -> Path:  # fmt: skip
    """A run directory as a run leaves it (run.json, models/client_0/*), for client 0 on
    centre 0, its models written by the run's own writer."""
    run_dir = root / algorithm / "seed_0"
    config = TrainConfig(algorithm=algorithm, data=data, run_dir=run_dir, centers=[0],
                         rounds=1, proxy_model="cnn1", private_model=["cnn1"])  # fmt: skip
    run_dir.mkdir(parents=True)
    privacy = {"notion": "sample_dp", "epsilon": epsilon, "delta": 1e-5}
    (run_dir / "run.json").write_text(json.dumps({
        "status": status, "algorithm": algorithm,
        "config": config.model_dump(mode="json"),
        "clients": [{"rank": 0, "client": 0, "center": 0}], "privacy": {"0": privacy},
    }))  # fmt: skip
    for name, model in models.items():
        card = ModelCard(architecture="cnn1", n_classes=2, input_size=16, patch_size=16,
                         normalisation=NORMALISATION, classes=CLASSES, evaluated_model=name,
                         algorithm=algorithm, seed=0, client=0, center=0, rounds=1,
                         config_digest=config.digest())  # fmt: skip
        save_trained(model, trained_path(run_dir, 0, name), card)
    return run_dir


def _split(data: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    reader = PatchSplitReader(store_path(data, 0), split)
    return np.asarray(reader.images()), np.asarray(reader.labels, dtype=np.int64)


RECIPE = ReferenceRecipe("cnn1", 2, 16, epochs=60, batch_size=8, lr=3e-3, weight_decay=0.0)


def _dp_trained(
    images: np.ndarray, labels: np.ndarray, epochs: int, sigma: float
) -> torch.nn.Module:
    """cnn1 trained with DP-Adam (Opacus, Poisson batches of 16, C = 0.7)."""
    torch.manual_seed(0)
    model = build_model("cnn1", 2, 16)
    dataset = TensorDataset(torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))),
                            torch.from_numpy(labels))  # fmt: skip
    training = make_private(model, torch.optim.Adam(model.parameters(), lr=3e-3), dataset,
                            batch_size=16, sigma=sigma, clip=0.7,
                            sampler_generator=torch.Generator().manual_seed(1),
                            noise_generator=torch.Generator().manual_seed(2))  # fmt: skip
    for _ in range(epochs):
        for x, y in training.loader:
            training.optimizer.zero_grad()
            if len(y):
                F.cross_entropy(training.module(prepare_images(x, torch.device("cpu"), 16)),
                                y).backward()  # fmt: skip
            training.optimizer.step()
    return training.model.eval()


def _unlearnable_store(directory: Path, n_train: int, n_test: int) -> Path:
    """Centre 0 whose labels are coin flips, independent of the pixels: a model can only
    memorise its training patches, and a member is told apart by its loss alone."""
    rng = np.random.default_rng(11)
    splits = {}
    for split, n in (("train", n_train), ("test", n_test)):
        batch = make_split(rng, n, 0, split, 16)
        splits[split] = batch.__class__(**{**batch.__dict__, "labels": rng.integers(0, 2, n)})
    attrs = StoreAttrs(center=0, patch_size=16, level=0, mpp=0.25, n_classes=2,
                       params_hash="test")  # fmt: skip
    directory.mkdir(parents=True)
    write_patch_store(store_path(directory, 0), attrs, splits)
    return directory


@pytest.fixture(scope="module")
def few_patches(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Centre 0, 24 training and 48 held-out patches with labels a model must memorise."""
    return _unlearnable_store(tmp_path_factory.mktemp("few") / "stores", 24, 48)


def test_a_model_trained_without_dp_on_few_patches_is_found(
    tmp_path: Path, few_patches: Path
) -> None:
    images, labels = _split(few_patches, "train")
    memorised = train_reference(RECIPE, images, labels, seed=0)
    untrained = build_model("cnn1", 2, 16).eval()
    run_dir = _run_dir(tmp_path / "runs", few_patches,
                       {"private": memorised, "proxy": untrained}, epsilon=2.0)  # fmt: skip
    for references in (0, 2):
        options = AuditOptions(reference_models=references, bootstrap=100)
        rows = {row["evaluated_model"]: row
                for row in audit_training_run(run_dir, few_patches, options)}  # fmt: skip
        found, blind = rows["private"], rows["proxy"]
        assert found["attack"] == ("lira_offline" if references else "loss")
        assert found["mia_auc"] > 0.75 and found["mia_auc_ci"][0] > 0.5, found["mia_auc"]
        assert abs(blind["mia_auc"] - 0.5) < found["mia_auc"] - 0.5
        assert (found["n_members"], found["n_non_members"]) == (24, 48)
        assert not found["released"] and found["privacy_notion"] == "none"
        assert blind["released"] and blind["epsilon_accounted"] == 2.0
        assert found["epsilon_lower_bound"] is None  # no canaries in a training run


@pytest.fixture(scope="module")
def canary_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_stores(tmp_path_factory.mktemp("canary"), centers=(0,), n_train=96, n_test=8)


def _canary_run(root: Path, data: Path, plan: CanaryPlan, model: torch.nn.Module,
                epsilon: float | None, name: str) -> Path:  # fmt: skip
    canary_dir = root / "canary"
    run_dir = _run_dir(canary_dir, data, {name: model}, epsilon)
    run_dir.rename(canary_dir / "run")
    (canary_dir / "ProxyFL").rmdir()
    (canary_dir / "canaries.json").write_text(plan.to_json())
    return canary_dir


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_the_canary_bound_finds_a_model_without_dp_and_respects_dp(
    tmp_path: Path, canary_store: Path
) -> None:
    """64 noise canaries beside 96 patches, 40 epochs: without DP the model learns the IN
    canaries' labels and the bound is well above 0; with DP-SGD at the demo's σ = 1.4 the
    bound stays at or below the accountant's ε for the same training."""
    images, stored = _split(canary_store, "train")
    plan = CanaryPlan.draw({0: stored}, count=64, n_classes=2, patch_size=16, seed=0)
    data = plan.training_data(0, stored)
    assert data.extra_images is not None and data.extra_labels is not None
    train_images = np.concatenate([images[data.rows], data.extra_images])
    labels = np.concatenate([data.labels, data.extra_labels])
    options = AuditOptions(bootstrap=50, canary={"guesses": [8, 16, 32]})

    no_dp = train_reference(RECIPE.__class__(**{**RECIPE.__dict__, "epochs": 40}),
                            train_images, labels, seed=1)  # fmt: skip
    found = audit_canary_run(_canary_run(tmp_path / "a", canary_store, plan, no_dp, None,
                                         "private"), canary_store, options)[0]  # fmt: skip
    assert found["run"] == "canary" and found["canaries"] == 64
    assert found["epsilon_lower_bound"] > 1.0, found
    assert found["mia_auc"] > 0.8

    epsilon = planned_epsilon(len(labels), 16, 1.4, 40, 1e-5)
    dp = _dp_trained(train_images, labels, epochs=40, sigma=1.4)
    kept = audit_canary_run(_canary_run(tmp_path / "b", canary_store, plan, dp, epsilon,
                                        "proxy"), canary_store, options)[0]  # fmt: skip
    assert kept["epsilon_accounted"] == pytest.approx(epsilon)
    assert kept["epsilon_lower_bound"] <= epsilon
    assert kept["epsilon_lower_bound"] < found["epsilon_lower_bound"]
    assert violations([found, kept]) == []
    # a bound above the accounted ε is a violation, named
    broken = {**kept, "epsilon_lower_bound": epsilon + 1}
    assert "ε lower bound" in violations([broken])[0]
    assert audit_document([broken], options)["violations"]
    assert str(AuditViolation("results/audit.json", "a bug")) == "results/audit.json: a bug"


# -- bad input -----------------------------------------------------------------------------


def test_bad_input_is_a_clear_error(tmp_path: Path, few_patches: Path) -> None:
    options = AuditOptions(reference_models=0, bootstrap=10)
    model = build_model("cnn1", 2, 16).eval()
    no_models = _run_dir(tmp_path / "a", few_patches, {}, 1.0)
    with pytest.raises(AuditInputError, match=r"models/client_0: no kept model"):
        audit_training_run(no_models, few_patches, options)
    unfinished = _run_dir(tmp_path / "b", few_patches, {"proxy": model}, 1.0, status="running")
    with pytest.raises(AuditInputError, match="running, not finished"):
        audit_training_run(unfinished, few_patches, options)
    with pytest.raises(AuditInputError, match=r"run\.json: missing"):
        audit_training_run(tmp_path / "nowhere", few_patches, options)
    no_test = write_stores(tmp_path / "no_test", centers=(0,), n_train=8, n_test=0)
    run_dir = _run_dir(tmp_path / "c", no_test, {"proxy": model}, 1.0)
    with pytest.raises(AuditInputError, match=r"no held-out \(test\) patches"):
        audit_training_run(run_dir, no_test, options)
    with pytest.raises(AuditInputError, match=r"canaries\.json: missing"):
        audit_canary_run(tmp_path / "c" / "ProxyFL", few_patches, options)
    with pytest.raises(ValueError, match="PrivateKT's guarantee is label-level"):
        TrainConfig(algorithm="PrivateKT", canaries=tmp_path / "canaries.json")
    with pytest.raises(ValueError, match="pairs"):
        AuditOptions(reference_models=3)


def test_the_summary_names_each_models_auc_and_each_canary_bound() -> None:
    rows = [
        {"run": "training", "method": "ProxyFL", "evaluated_model": "private", "mia_auc": 0.6},
        {"run": "training", "method": "ProxyFL", "evaluated_model": "private", "mia_auc": 0.5},
        {"run": "canary", "method": "ProxyFL", "client": 1, "evaluated_model": "proxy",
         "epsilon_lower_bound": 0.25, "epsilon_accounted": 3.5},
        {"run": "canary", "method": "ProxyFL", "client": 1, "evaluated_model": "private",
         "epsilon_lower_bound": 2.0, "epsilon_accounted": None},
    ]  # fmt: skip
    assert summary_lines(rows) == [
        "membership AUC ProxyFL private: 0.550 (mean of 2 client(s))",
        "canary run ProxyFL client 1 proxy: ε lower bound 0.25, accounted 3.50",
        "canary run ProxyFL client 1 private: ε lower bound 2.00, accounted none (no DP)",
    ]


def test_a_canary_run_whose_coins_fell_on_one_side_has_a_bound_and_no_auc(
    tmp_path: Path, canary_store: Path
) -> None:
    """Few canaries can all land OUT (each with probability ½): the bound is still defined
    (0), the canary AUC is not, and the report says "—" rather than failing."""
    from analysis.report.audit import audit_markdown, read_audit
    from proxyfl.canaries import CanarySet
    from proxyfl.results import atomic_write_json

    all_out = CanarySet(included=(False,) * 4, labels=(0, 1, 0, 1))
    plan = CanaryPlan(seed=0, kind="noise", patch_size=16, centers={0: all_out})
    model = build_model("cnn1", 2, 16).eval()
    options = AuditOptions(bootstrap=10, canary={"guesses": [1, 2]})
    row = audit_canary_run(_canary_run(tmp_path, canary_store, plan, model, 2.0, "proxy"),
                           canary_store, options)[0]  # fmt: skip
    assert row["epsilon_lower_bound"] == 0.0 and row["mia_auc"] is None
    assert (row["n_members"], row["n_non_members"]) == (0, 4)
    path = tmp_path / "audit.json"
    atomic_write_json(path, audit_document([row], options))
    table = audit_markdown(read_audit(path))
    assert "| ProxyFL | 0 | proxy | yes | 2.00 | 0.00 | 4 |" in table
    assert table.split("| ProxyFL | 0 | proxy |")[1].splitlines()[0].rstrip().endswith("| — |")
