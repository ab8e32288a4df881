"""The run configuration: one validated object, from ``params.yaml``'s ``train:`` section and CLI.

Field names are the keys of ``params.yaml``'s ``train:`` section and, with ``_`` written as
``-``, the command-line options of :mod:`proxyfl.run`. Defaults are the paper's
histopathology configuration (ProxyFL, Nature Communications 2023): 30 rounds of one local
epoch, batch 32, Adam / DP-Adam with learning rate 1e-3, σ = 1.4, C = 0.7, δ = 1e-5,
α = β = 0.3, GroupNorm ResNet-18 for every model. The input size defaults to the stores'
own patch size (512 px on the real data); nothing here assumes 512 px or two classes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from plumbing.cli import ConfigError
from plumbing.parameters import Parameters, distinct
from proxyfl.comm.graphs import matrices_digest, parse_schedule_spec
from proxyfl.names import ALGORITHMS, MODEL_NAMES, Algorithm

logger = logging.getLogger(__name__)

DeviceChoice = Literal["auto", "cpu", "cuda"]


class TrainOptions(Parameters):
    """How every client trains: ``params.yaml``'s ``train.options``, the same for every job.

    The defaults are the paper's histopathology configuration.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(30, ge=1, description="communication rounds")
    local_epochs: int = Field(
        1, ge=1, description="local epochs per round of the DP methods (PrivateKT: kt_local_epochs)"
    )
    batch_size: int = Field(32, ge=1, description="expected Poisson batch size B")
    eval_batch_size: int = Field(64, ge=1, description="batch size for evaluation")
    # The paper records ProxyFL's and FML's private models only (Figure 8, Table 2); at its
    # scale their proxy is a ResNet-18 too and costs as much to evaluate as the private one.
    round_evaluation: Literal["primary", "all"] = Field(
        "primary",
        description="the models evaluated after every round but the final: primary (the "
        "one the paper reports: ProxyFL's and FML's private model, every other method's only "
        "one) or all (the proxy's curve in metrics.jsonl too); the final round evaluates all",
    )
    lr: float = Field(
        1e-3, gt=0, description="Adam / DP-Adam learning rate of the DP methods (PrivateKT: kt_lr)"
    )
    # The paper trains both models of ProxyFL/FML with one learning rate. A model trained
    # without DP noise may want a smaller step than its DP proxy: None keeps the paper's.
    private_lr: float | None = Field(
        None,
        gt=0,
        description="Adam learning rate of ProxyFL's and FML's private (non-DP) model "
        "(null: lr, as in the paper)",
    )
    weight_decay: float = Field(1e-4, ge=0, description="Adam weight decay")
    sigma: float = Field(1.4, ge=0, description="DP-SGD noise multiplier σ")
    clip: float = Field(0.7, gt=0, description="DP-SGD per-example clipping norm C")
    delta: float = Field(1e-5, gt=0, lt=1, description="δ of the (ε, δ) guarantee")
    dml_alpha: float = Field(0.3, ge=0, le=1, description="KL weight α of the private loss")
    dml_beta: float = Field(0.3, ge=0, le=1, description="KL weight β of the proxy's loss")
    private_model: list[str] = Field(
        default_factory=lambda: ["resnet18_gn"],
        description=f"private architecture: one name, or one per client ({', '.join(MODEL_NAMES)})",
    )
    proxy_model: str = Field("resnet18_gn", description="the shared (DP) model's architecture")
    input_size: int | None = Field(
        None, ge=1, description="resize patches to this side (null: the stores' own size)"
    )
    device: DeviceChoice = Field("auto", description="auto: a GPU per rank when there are GPUs")
    # The same DP-SGD mechanism either way (proxyfl/privacy/dp.py); func has no hooks and is
    # faster on a GPU (2.7x, ../shared/gpu) and for the demo's cnn1 on a CPU (1.5x).
    dp_engine: Literal["func", "opacus"] = Field(
        "func",
        description="how DP-SGD computes per-example gradients: func (torch.func's vmap(grad), "
        "chunked) or opacus (Opacus' hooks); same sampling, clipping, noise and accounting",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="the func engine's per-example forward: bf16 (autocast; norms, clipping "
        "and sums stay fp32) or fp32; auto: bf16 on CUDA, fp32 on a CPU",
    )
    compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="torch.compile the DP engine's per-example function and the private "
        "model's step (auto: on for CUDA when the run's steps repay the compilation, "
        "proxyfl/engine/compilation.py; a CPU needs a C++ compiler)",
    )
    compile_cache: str = Field(
        ".cache/torch-compile",
        description="directory of torch.compile's persistent cache (inductor's and "
        "Triton's), relative to the working directory: the runs of a table compile once "
        "per machine",
    )
    dp_chunk_size: int | None = Field(
        None,
        ge=1,
        description="examples per chunk of per-example gradients (func engine; null: as "
        "many as the memory budget holds, at most the largest plausible Poisson batch)",
    )
    gpu_memory_gb: float | None = Field(
        None,
        gt=0,
        description="memory budget of one rank in GB, for the per-example chunks and the "
        "evaluation batch (null: the device's memory over the ranks that share it, at most "
        "6 GB on a GPU that several ranks share)",
    )
    deterministic: bool = Field(
        True,
        description="torch's deterministic algorithms (CUBLAS_WORKSPACE_CONFIG, no cudnn "
        "benchmark): GPU runs and their resumes reproduce bit for bit, ~8 % slower on a GPU; "
        "false trades that for speed",
    )
    graph: str = Field(
        "exponential",
        description="exponential | exponential_mix | exponential_uneven | file:PATH",
    )
    epsilon_budget: float | None = Field(
        None, gt=0, description="a client stops once its ε would exceed this"
    )
    loader_workers: int = Field(0, ge=0, description="DataLoader worker processes per rank")
    prefetch: int = Field(
        2,
        ge=0,
        description="batches a thread of each rank reads, converts and pins ahead of the "
        "step it is running (0: read each batch when the step needs it)",
    )
    torch_threads: int | None = Field(
        None,
        ge=1,
        description="torch's intra-op threads per rank (null: by placement, the cores of "
        "its node over the ranks on it, or the cores a launcher bound it to)",
    )
    keep_checkpoints: int = Field(2, ge=2, description="checkpoints kept per rank")
    # A finished run deletes its checkpoints (hundreds of MB per rank) unless asked to keep them.
    keep_final_checkpoints: bool = Field(
        False, description="keep a finished run's checkpoints (they serve --resume)"
    )
    # PrivateKT (Qi et al., Nature Communications 2023; docs/algorithms.md §4). The paper gives
    # ε = 5 (its experiments) and K = 2 (its Fig. 4: "a small number of samples (e.g., 2)");
    # B, M and the server's fine-tuning epochs are not in the paper's main text: their
    # defaults are the authors' code (github.com/taoqi98/PrivateKT, main.ipynb/PrivateKT.py).
    # The public pool: the paper's is a random 20 % of the training data with its labels
    # dropped (the authors' main.ipynb: public_data_ratio = 0.2); a hospital's realistic
    # one is another centre's store (``center``).
    public_pool: Literal["share", "center"] = Field(
        "share",
        description="PrivateKT: the unlabelled public pool, a share of every client's "
        "training split held out (share, the paper's) or public_center's store (center)",
    )
    public_share: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="PrivateKT: the share of each client's training split held out as the "
        "public pool (the authors' public_data_ratio, 0.2)",
    )
    public_center: int = Field(
        4,
        ge=0,
        description="PrivateKT with public_pool: center: the centre whose store is the pool",
    )
    # How PrivateKT trains: the authors' code (PrivateKT.py: epoch1 = 5 local epochs of
    # Keras' fit, batch 32; model.py: plain SGD, main.ipynb: lr = 0.05, for the clients and
    # the server alike). Its own options, not the DP methods' lr and local_epochs.
    kt_local_epochs: int = Field(
        5, ge=1, description="PrivateKT: local epochs per round (authors' code: 5)"
    )
    kt_optimizer: Literal["sgd", "adam"] = Field(
        "sgd", description="PrivateKT: the clients' and the server's optimizer (authors': sgd)"
    )
    kt_lr: float = Field(
        0.05, gt=0, description="PrivateKT: learning rate of kt_optimizer (authors': 0.05)"
    )
    kt_optimizer_state: Literal["fresh", "kept"] = Field(
        "fresh",
        description="PrivateKT: a client's optimizer starts afresh each round, as the global "
        "model it trains does (fresh), or keeps its moments across rounds (kept)",
    )
    kt_samples: int = Field(
        2, ge=1, description="PrivateKT: K, knowledge-transfer items labelled per round"
    )
    ldp_epsilon: float = Field(
        5.0, gt=0, description="PrivateKT: ε of the label-level ε-LDP of one round (Lemma 1)"
    )
    buffer_size: int = Field(
        25, ge=1, description="PrivateKT: B, rounds of aggregated knowledge the buffer keeps"
    )
    self_train_samples: int | None = Field(
        None,
        ge=1,
        description="PrivateKT: M, public items the server self-trains on per round "
        "(null: a tenth of the public pool, as in the authors' code)",
    )
    finetune_epochs: int = Field(
        4, ge=1, description="PrivateKT: the server's passes over the knowledge buffer per round"
    )
    finetune_batches: Literal["full", "minibatch"] = Field(
        "full",
        description="PrivateKT: each pass over the buffer is one step on all of it (full, "
        "the authors' train_on_batch) or batch_size minibatches",
    )
    client_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="PrivateKT: the server selects int(fraction x active clients), at least "
        "one, each round (authors: 0.5)",
    )
    first_kt_items: Literal["importance", "uniform"] = Field(
        "importance",
        description="PrivateKT: round 1's KT items by Eq. (4) under the initial model "
        "(importance, the authors' code) or uniformly (uniform, Algorithm 1 line 3)",
    )
    buffer: bool = Field(
        True,
        description="PrivateKT: fine-tune on the knowledge buffer of B rounds "
        "(--no-buffer: on this round's knowledge only; the paper's Fig. 3 ablation)",
    )
    self_training: bool = Field(
        True, description="PrivateKT: self-train on M confident public items (Eq. 5)"
    )
    # Eq. (5) says which items, not which targets: the authors' code fits the model's own
    # class probabilities (a consistency step); its argmax labels sharpen every guess, and
    # from a model near chance they pull it to one class (measured: docs/algorithms.md §4).
    self_train_targets: Literal["soft", "argmax"] = Field(
        "soft",
        description="PrivateKT: self-training targets, the model's own class probabilities "
        "(soft, the authors' code) or its argmax labels",
    )
    uniform_sampling: bool = Field(
        False, description="PrivateKT: draw KT items uniformly instead of by Eq. (4)"
    )


def _distinct_centre_ids(value: list[int], flag: str) -> list[int]:
    """``value``, a list of centres, if each is a non-negative id listed once."""
    negative = [c for c in value if c < 0]
    if negative:
        raise ValueError(f"centre ids must be non-negative, got {negative}")
    return list(distinct(value, f"{flag} {value}: centre(s)"))


class TrainConfig(TrainOptions):
    """Everything one training job depends on: the options and what the job is
    (method, seed, stores, run directory, centres). A flow writes it to
    ``RUN_DIR/config.json``; ``proxyfl.run --config RUN_DIR/config.json`` reads it."""

    algorithm: Algorithm = Field("ProxyFL", description=f"one of {', '.join(ALGORITHMS)}")
    data: Path | None = Field(None, description="directory holding center_{c}.h5 stores")
    run_dir: Path | None = Field(
        None, description="the run directory (train.runs/ALGORITHM/seed_S)"
    )
    centers: list[int] | None = Field(
        None, description="the clients' centres, one client each (default 0..R-1, a client "
        "per rank)",
    )  # fmt: skip
    eval_centers: list[int] | None = Field(
        None, description="centres evaluated on only, not clients: their test splits join "
        "the clients' (none of their training data is read), e.g. a hospital that did not "
        "train",
    )  # fmt: skip
    ranks: int | None = Field(
        None, ge=1, description="processes (MPI ranks) the clients run on, each hosting "
        "⌊C/R⌋ or ⌈C/R⌉ of the C clients in turn; the results are the same bytes whatever "
        "the number (default: one rank per client)",
    )  # fmt: skip
    seed: int = Field(0, description="run seed")
    resume: bool = Field(False, description="continue from the run directory's checkpoints")
    canaries: Path | None = Field(
        None,
        description="a canary plan (canaries.json, proxyfl.canaries): the run trains on "
        "its IN canaries with their labels and leaves out its OUT ones (the audit's canary run)",
    )
    evaluate_every_round: bool = Field(
        True,
        description="evaluate on the merged test splits after every round (metrics.jsonl's "
        "curves); false: after the final round only (the audit's canary run, whose accuracy "
        "nobody reads)",
    )
    # Test hook: finish this round (checkpoint included), then exit abnormally on every rank.
    stop_after_round: int | None = Field(None, ge=1, json_schema_extra={"hidden": True})

    @model_validator(mode="before")
    @classmethod
    def _former_names(cls, data: Any) -> Any:
        # config.json and run.json of runs made before the rename name the run directory
        # ``out``; they still resume and relocate.
        if isinstance(data, dict) and "out" in data and "run_dir" not in data:
            data = {("run_dir" if key == "out" else key): value for key, value in data.items()}
        return data

    @field_validator("algorithm", mode="before")
    @classmethod
    def _known_algorithm(cls, value: Any) -> Any:
        if isinstance(value, str):
            for name in ALGORITHMS:
                if value.lower() == name.lower():
                    return name
            raise ValueError(f"unknown algorithm {value!r}; choose one of {', '.join(ALGORITHMS)}")
        return value

    @field_validator("private_model", mode="before")
    @classmethod
    def _as_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part for part in value.replace(",", " ").split() if part]
        return value

    @field_validator("private_model")
    @classmethod
    def _known_private_models(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one private model name is needed")
        for name in value:
            _check_model_name(name)
        return value

    @field_validator("proxy_model")
    @classmethod
    def _known_proxy_model(cls, value: str) -> str:
        _check_model_name(value)
        return value

    @field_validator("centers")
    @classmethod
    def _distinct_centers(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("--centers needs at least one centre")
        return _distinct_centre_ids(value, "--centers")

    @field_validator("eval_centers")
    @classmethod
    def _distinct_eval_centers(cls, value: list[int] | None) -> list[int] | None:
        return _distinct_centre_ids(value, "--eval-centers") if value else None

    @field_validator("graph")
    @classmethod
    def _known_graph(cls, value: str) -> str:
        parse_schedule_spec(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.canaries is not None and self.algorithm == "PrivateKT":
            raise ValueError(
                "--canaries: PrivateKT's guarantee is label-level LDP, which a sample-level "
                "canary audit does not test; audit a DP-SGD method"
            )
        both = sorted(set(self.centers or []) & set(self.eval_centers or []))
        if both:
            raise ValueError(f"centre(s) {both} are in --centers and --eval-centers: a "
                             "centre is a client (trained and evaluated on) or evaluated on "
                             "only")  # fmt: skip
        if self.ranks is not None and self.centers is not None and self.ranks > len(self.centers):
            raise ValueError(f"--ranks {self.ranks} for {len(self.centers)} client(s): at "
                             "most one rank per client (Joint runs as one)")  # fmt: skip
        if self.centers is not None and len(self.private_model) not in (1, len(self.centers)):
            raise ValueError(
                f"--private-model lists {len(self.private_model)} models for "
                f"{len(self.centers)} centres; give one name, or one per centre"
            )
        if self.graph.startswith("file:") and self.centers is not None:
            size = parse_schedule_spec(self.graph).matrices[0].shape[0]
            if size != len(self.centers):  # else found in round 1, after the set-up
                raise ValueError(f"--graph {self.graph}: its matrices are {size}x{size}, for "
                                 f"a job of {len(self.centers)} clients (one row and column "
                                 "per client)")  # fmt: skip
        return self

    def require_paths(self) -> tuple[Path, Path]:
        """``(data, run_dir)``; a :class:`ConfigError` if either is missing."""
        if self.data is None or self.run_dir is None:
            raise ConfigError(None, "both --data DIR and --run-dir RUN_DIR are required")
        return self.data, self.run_dir

    @property
    def private_learning_rate(self) -> float:
        """The private model's Adam learning rate: ``private_lr``, else ``lr``."""
        return self.lr if self.private_lr is None else self.private_lr

    def autocast_on(self, device_type: str) -> bool:
        """Does the func engine's per-example forward run in bfloat16 on ``device_type``?"""
        if self.dp_engine != "func":
            return False
        return self.precision == "bf16" or (self.precision == "auto" and device_type == "cuda")

    def private_model_for(self, client: int) -> str:
        """The private architecture of client ``client`` (one name for all, or one each)."""
        if len(self.private_model) == 1:
            return self.private_model[0]
        return self.private_model[client]

    @property
    def public_store_center(self) -> int | None:
        """The centre whose whole store is PrivateKT's public pool (``public_pool: center``);
        ``None`` for the share pool and for every other method."""
        if self.algorithm == "PrivateKT" and self.public_pool == "center":
            return self.public_center
        return None

    def client_centers(self, world_size: int) -> list[int]:
        """The centre of each client, in client order (default 0..R-1 for R ranks)."""
        return list(self.centers) if self.centers is not None else list(range(world_size))

    def job_ranks(self) -> int:
        """The processes a job of this configuration runs on: one for Joint; else ``ranks``,
        or one per client (``centers`` must be set)."""
        if self.centers is None:
            raise ValueError("a job's ranks follow from its centres: set centers")
        if self.algorithm == "Joint":
            return 1
        return self.ranks or len(self.centers)

    def test_centers(self, world_size: int) -> list[int]:
        """The centres whose test splits every client is evaluated on: the clients', then
        ``eval_centers``."""
        return [*self.client_centers(world_size), *(self.eval_centers or [])]

    def fingerprint(self) -> dict[str, Any]:
        """The configuration a run's result depends on: the fields that must not change
        when it is resumed, and that a finished run is compared by. Where the run and its
        stores are (``run_dir``, ``data``: the stores are identified by their content, see
        :func:`proxyfl.launch.rundir.run_inputs`) and how it runs (device, loader_workers,
        checkpoints kept) are not part of it; nor where a ``file:`` graph lies: it is
        identified by its matrices (:func:`~proxyfl.comm.graphs.matrices_digest`), so that a
        file edited between two attempts is a change and a copy elsewhere (a federation's
        site's) is not."""
        ignored = set(WHERE_AND_HOW_FIELDS)
        if self.algorithm != "PrivateKT":  # other methods' runs do not depend on them
            ignored |= set(PRIVATEKT_FIELDS)
        if self.canaries is None:  # the fingerprints of runs made before canaries existed
            ignored.add("canaries")
        if self.eval_centers is None:  # likewise
            ignored.add("eval_centers")
        if self.evaluate_every_round:  # likewise
            ignored.add("evaluate_every_round")
        if self.round_evaluation == "all":  # likewise: every model was evaluated before
            ignored.add("round_evaluation")
        if self.dp_engine == "opacus":  # likewise: the one engine there was
            ignored |= {"dp_engine", "precision"}
        data = self.model_dump(mode="json")
        if self.graph.startswith("file:"):
            data["graph"] = (
                f"file sha256:{matrices_digest(parse_schedule_spec(self.graph).matrices)}"
            )
        return {key: value for key, value in data.items() if key not in ignored}

    def digest(self) -> str:
        """SHA-256 of :meth:`fingerprint` (canonical JSON): equal digests, equal
        configurations."""
        return fingerprint_digest(self.fingerprint())


# Where a run is and how it runs, not what it computes (TrainConfig.fingerprint).
WHERE_AND_HOW_FIELDS: tuple[str, ...] = (
    "run_dir", "out", "data", "resume", "stop_after_round", "device", "loader_workers",
    "keep_checkpoints", "keep_final_checkpoints", "compile", "dp_chunk_size", "gpu_memory_gb",
    "deterministic", "compile_cache", "prefetch", "torch_threads", "ranks",
)  # fmt: skip


def fingerprint_digest(fingerprint: Mapping[str, Any]) -> str:
    """SHA-256 hex digest of a fingerprint as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def fingerprint_changes(
    recorded: Mapping[str, Any], current: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """``{key: (recorded value, current value)}`` for every key whose value differs, keys
    of :data:`WHERE_AND_HOW_FIELDS` ignored (runs recorded before they were left out of
    the fingerprint still hold ``data`` and ``out``, ``run_dir``'s former name)."""
    keys = (set(recorded) | set(current)) - set(WHERE_AND_HOW_FIELDS)
    return {key: (recorded.get(key), current.get(key))
            for key in sorted(keys) if recorded.get(key) != current.get(key)}  # fmt: skip


PRIVATEKT_FIELDS: tuple[str, ...] = (
    "public_pool", "public_share", "public_center", "kt_local_epochs", "kt_optimizer", "kt_lr",
    "kt_optimizer_state", "kt_samples", "ldp_epsilon", "buffer_size", "self_train_samples",
    "finetune_epochs", "finetune_batches", "client_fraction", "first_kt_items", "buffer",
    "self_training", "self_train_targets", "uniform_sampling",
)  # fmt: skip


def _check_model_name(name: str) -> None:
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
