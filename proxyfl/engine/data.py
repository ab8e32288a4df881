"""Patch stores as PyTorch datasets, through the one schema in :mod:`wsi.store`.

Images stay uint8 (N, S, S, 3) on disk and cross the DataLoader as uint8 (3, S, S)
tensors; :func:`prepare_images` turns a batch into model input on the device:
``x = (pixel/255 - 0.5) / 0.5`` ∈ [-1, 1] per channel, then, when ``input_size`` differs
from S, a bilinear (antialiased) resize to ``input_size``×``input_size``.

Every split a process opens goes through :func:`open_split`, which records ``(path, split)``
in an :class:`AccessLog`; the run writes that log per rank so that anyone can check that
rank k opened no other centre's training split.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from proxyfl.engine.access import ACCESS_LOG, AccessLog
from wsi.store.reader import PatchSplitReader
from wsi.store.schema import store_path


def open_split(
    directory: str | os.PathLike[str], center: int, split: str, log: AccessLog = ACCESS_LOG
) -> PatchSplitReader:
    """A reader over centre ``center``'s ``split``, recorded in ``log``."""
    path = store_path(directory, center)
    log.record(path, split)
    return PatchSplitReader(path, split)


class PatchDataset(Dataset):
    """The concatenation of one or more store splits: items ``(uint8 (3,S,S), int64 label)``.

    ``rows`` (one entry per reader, ``None``: all of it) keeps only those rows of a split,
    in order: PrivateKT's clients leave out the rows held out as the public pool.
    ``labels`` (one entry per reader, aligned with its rows; ``None``: the stored ones)
    replaces the labels, and ``extra`` (uint8 (n, S, S, 3) images and their labels) comes
    after every split's rows: the audit's canaries (:mod:`proxyfl.canaries`)."""

    def __init__(
        self,
        readers: Sequence[PatchSplitReader],
        rows: Sequence[np.ndarray | None] | None = None,
        labels: Sequence[np.ndarray | None] | None = None,
        extra: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        if not readers:
            raise ValueError("a dataset needs at least one split")
        sizes = {reader.info.attrs.patch_size for reader in readers}
        if len(sizes) != 1:
            raise ValueError(f"splits have different patch sizes {sorted(sizes)}")
        self.readers = list(readers)
        self.patch_size = sizes.pop()
        chosen = list(rows) if rows is not None else [None] * len(self.readers)
        if len(chosen) != len(self.readers):
            raise ValueError(f"{len(chosen)} row selections for {len(self.readers)} splits")
        self.rows = [np.arange(len(reader), dtype=np.int64) if kept is None
                     else np.asarray(kept, dtype=np.int64)
                     for reader, kept in zip(self.readers, chosen, strict=True)]  # fmt: skip
        self._offsets = np.cumsum([0] + [len(kept) for kept in self.rows])
        given = list(labels) if labels is not None else [None] * len(self.readers)
        if len(given) != len(self.readers):
            raise ValueError(f"{len(given)} label replacements for {len(self.readers)} splits")
        parts = []
        for reader, kept, replaced in zip(self.readers, self.rows, given, strict=True):
            if replaced is not None and len(replaced) != len(kept):
                raise ValueError(f"{len(replaced)} labels for {len(kept)} rows")
            parts.append(reader.labels[kept] if replaced is None else np.asarray(replaced))
        self.extra_images = np.zeros((0, self.patch_size, self.patch_size, 3), dtype=np.uint8)
        if extra is not None:
            self.extra_images = np.asarray(extra[0], dtype=np.uint8)
            if self.extra_images.shape[1:] != (self.patch_size, self.patch_size, 3):
                raise ValueError(f"extra patches {self.extra_images.shape[1:]}, the splits' "
                                 f"are {self.patch_size}x{self.patch_size}x3")  # fmt: skip
            parts.append(np.asarray(extra[1]).reshape(len(self.extra_images)))
        self._offsets = np.r_[self._offsets, self._offsets[-1] + len(self.extra_images)]
        self.labels = np.concatenate(parts).astype(np.int64)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def _locate(self, index: int) -> tuple[int, int]:
        """(part, row): part ``len(readers)`` is the extra patches."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        part = int(np.searchsorted(self._offsets, index, side="right") - 1)
        local = index - int(self._offsets[part])
        return part, (local if part == len(self.readers) else int(self.rows[part][local]))

    def _image(self, part: int, local: int) -> np.ndarray:
        if part == len(self.readers):
            return self.extra_images[local]
        return self.readers[part].image(local)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        part, local = self._locate(int(index))
        return _to_chw(self._image(part, local)), torch.tensor(self.labels[index],
                                                                dtype=torch.int64)  # fmt: skip

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A batch in one read per split (DataLoader calls this instead of ``__getitem__``)."""
        indices = [int(i) for i in indices]
        if not indices:
            return []
        images: list[np.ndarray | None] = [None] * len(indices)
        located = [self._locate(i) for i in indices]
        for part, reader in enumerate(self.readers):
            wanted = [(slot, local) for slot, (p, local) in enumerate(located) if p == part]
            if not wanted:
                continue
            block = reader.images([local for _, local in wanted])
            for (slot, _), image in zip(wanted, block, strict=True):
                images[slot] = image
        for slot, (part, local) in enumerate(located):
            if part == len(self.readers):
                images[slot] = self.extra_images[local]
        return [
            (_to_chw(image), torch.tensor(self.labels[i], dtype=torch.int64))
            for image, i in zip(images, indices, strict=True)
        ]


def _to_chw(image: np.ndarray | None) -> torch.Tensor:
    assert image is not None
    return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))


def prepare_images(
    images: torch.Tensor, device: torch.device, input_size: int | None = None
) -> torch.Tensor:
    """uint8 (N, 3, S, S) → float32 in [-1, 1] on ``device``, resized to ``input_size``."""
    x = images.to(device, non_blocking=True).float().div_(255.0).sub_(0.5).div_(0.5)
    if input_size is not None and x.shape[0] > 0 and x.shape[-1] != input_size:
        x = F.interpolate(
            x, size=(input_size, input_size), mode="bilinear", align_corners=False, antialias=True
        )
    elif input_size is not None and x.shape[0] == 0:
        x = x.new_zeros((0, x.shape[1], input_size, input_size))
    return x


def iterate_batches(
    readers: Sequence[PatchSplitReader], batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Every patch of ``readers`` in order, as uint8 (B, 3, S, S) and int64 (B,) tensors."""
    for reader in readers:
        for start in range(0, len(reader), batch_size):
            stop = min(start + batch_size, len(reader))
            block = reader.images(slice(start, stop))
            images = torch.from_numpy(np.ascontiguousarray(block.transpose(0, 3, 1, 2)))
            labels = torch.from_numpy(reader.labels[start:stop].astype(np.int64))
            yield images, labels
