"""The per-slide candidate cache: entries are found and forgotten by slide id."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from wsi.cache import CandidateCache
from wsi.catalogue import SlideRecord
from wsi.patches import PatchParams
from wsi.sampling import SlidePatches


def _record(root: Path, slide_id: str) -> SlideRecord:
    path = root / f"{slide_id}.tif"
    path.write_bytes(slide_id.encode())
    patient = int(slide_id.split("_")[1])
    return SlideRecord(slide_id, path, patient, 0, patient // 20, "negative", "pN0", None)


def _patches(record: SlideRecord) -> SlidePatches:
    return SlidePatches(
        record.slide_id, record.patient_id, record.path, np.zeros((1, 2), np.int64), np.zeros(1)
    )


def test_forget_removes_every_entry_of_the_slide_and_nothing_else(tmp_path: Path) -> None:
    cache = CandidateCache(tmp_path / "cache")
    assert cache.forget("patient_041_node_2") == []  # no directory yet
    victim = _record(tmp_path, "patient_041_node_2")
    others = [_record(tmp_path, "patient_041_node_3"), _record(tmp_path, "patient_041_node_22")]
    small, large = PatchParams(patch_size=128), PatchParams(patch_size=256)
    entries = [cache.save(victim, params, _patches(victim)) for params in (small, large)]
    kept = [cache.save(r, small, _patches(r)) for r in others]
    (cache.directory / "patient_041_node_2-notes.txt").write_text("not an entry")

    assert cache.entries(victim.slide_id) == sorted(entries)
    assert cache.forget(victim.slide_id) == sorted(entries)
    assert not any(path.exists() for path in entries)
    assert cache.load(victim, small) is None
    assert all(path.exists() for path in kept)
    assert cache.load(others[0], small) is not None
    assert (cache.directory / "patient_041_node_2-notes.txt").exists()
    assert cache.forget(victim.slide_id) == []


_KEY_OF_A_RECORD = """
import sys
import shutil
from pathlib import Path
from wsi.cache import cache_key
from wsi.catalogue import SlideRecord
from wsi.patches import PatchParams
path = Path(sys.argv[1])
record = SlideRecord("patient_041_node_2", path, 41, 2, 2, "negative", "pN0", None)
print(cache_key(record, PatchParams()))
"""


def test_the_key_follows_the_code_that_computes_candidates(tmp_path: Path) -> None:
    """A fix in wsi/masks.py must not be hidden by entries computed before it."""
    import subprocess
    import sys

    import wsi

    slide = _record(tmp_path, "patient_041_node_2").path
    package = Path(wsi.__file__).parent

    def key_with(code_root: Path) -> str:
        run = subprocess.run(
            [sys.executable, "-c", _KEY_OF_A_RECORD, str(slide)],
            cwd=code_root, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return run.stdout.strip()

    original = tmp_path / "original"
    shutil.copytree(package, original / "wsi")
    fixed = tmp_path / "fixed"
    shutil.copytree(package, fixed / "wsi")
    masks = fixed / "wsi" / "masks.py"
    masks.write_text(masks.read_text() + "\n# a fix\n")
    unrelated = tmp_path / "unrelated"
    shutil.copytree(package, unrelated / "wsi")
    store = unrelated / "wsi" / "store" / "writer.py"
    store.write_text(store.read_text() + "\n# formatting\n")

    assert key_with(original) == key_with(original)
    assert key_with(fixed) != key_with(original)
    assert key_with(unrelated) == key_with(original)
