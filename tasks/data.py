"""The dataset the pipeline starts from: checked, or written when it is the synthetic one."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

from camelyon_proxyfl.params.data import DATA_ROOT_FIX, DataSection
from wsi.catalogue import DatasetRootError, check_dataset_root


@task(name="dataset")
def dataset(data: DataSection) -> Path:
    """``data.root``, ready to preprocess: the embedded synthetic dataset is written first
    when it is absent; any other root must already be a Camelyon-17 dataset
    (:class:`~wsi.catalogue.DatasetRootError` otherwise, naming the path and the fix)."""
    from wsi.synth import dataset_is_written, generate_dataset

    logger = get_run_logger()
    if data.is_synthetic and not dataset_is_written(data.root):
        config = data.synth.config()
        total = len(config.patients()) * config.nodes_per_patient
        logger.info(
            "%s holds no synthetic dataset yet: writing it (%d slides of %dx%d px, "
            "data.synth in the parameters file)", data.root, total, config.width, config.height,
        )  # fmt: skip
        written = 0

        def progress(slide: object) -> None:
            nonlocal written
            written += 1
            logger.info("synthetic slide %d/%d written", written, total)

        generate_dataset(data.root, config, workers=data.synth.workers, on_slide=progress)
    require_dataset(data.root)
    return data.root


def require_dataset(root: Path) -> None:
    """:func:`~wsi.catalogue.check_dataset_root`, its error telling the user the fix."""
    try:
        check_dataset_root(root)
    except DatasetRootError as error:
        raise DatasetRootError(error.subject, f"{error.reason}; {DATA_ROOT_FIX}") from None
