"""The HDF5 patch store, one module per job: ``schema`` (its one definition),
``provenance``, ``space`` (disk space), ``writer`` and ``reader``.

One file per centre (``center_{c}.h5``)::

    attrs: schema_version, center, patch_size, level, mpp, n_classes, params_hash,
           provenance (schema 2: a JSON string, see :class:`Provenance`)
    /train, /test   groups whose datasets are aligned along N:
        images    (N, S, S, 3) uint8, chunked one patch per chunk, uncompressed
        labels    (N,) int64, 0 = healthy, 1 = tumour (or any 0..n_classes-1)
        patients  (N,) UTF-8 strings
        slides    (N,) UTF-8 strings
        coords    (N, 2) int64, level-0 (x, y) of the patch's top-left corner

Uncompressed one-patch chunks: lossless compression costs 10-40x write speed for 5-20 % of
size on H&E patches, and single-patch chunks read at ~1000 patches/s cold.

The writer fills a temporary file beside the target and commits it into place
(:func:`plumbing.atomic.commit`) only when every split is complete, so a crash never
leaves a store that looks whole.
It checks the free space first (:func:`store_bytes_needed`), and a disk that fills up
anyway ends in one :class:`StoreError` with the temporary removed (see
:class:`PatchStoreWriter`). The same inputs give the same bytes: no timestamps are
recorded (h5py's ``track_times`` is off), and the provenance is serialised with sorted keys.
The reader opens the file lazily per process, so it can be handed to DataLoader workers;
it reads schema 1 stores too (they only lack the provenance).
"""
