#!/usr/bin/env bash
# The GPU checks in one call of a lent device machine, well inside its 10 minutes: the
# project's tree travels with the wheels the machine lacks, in .whl (made here beforehand:
#   python -m bench.wheelhouse --out .whl --present bench/device/nvidia-h200.txt
# 16 wheels, ~51 MB), and
#   bash bench/device.sh            # in the device tool's `run`, carry [".whl"]
# installs them beside the machine's torch (pip --target, mpich's mpiexec and libraries
# unpacked from its wheel: --target drops them), checks every import, then runs
#   (1) python -m bench gpu --skip-determinism       (GPU_S, default 360 s)
#   (2) python -m bench clients --device cuda: 8 clients of the paper's model at 128 px on
#       1 rank, then on a rank each: each placement's peak GPU memory a rank, and whether
#       both wrote the same bytes on the GPU too                      (CLIENTS_S, 150 s)
# each under its own limit (SIGINT: gpu.json keeps the parts done; 9 min at most with the
# install), their output (seven files) in $OUT (the device tool's folder that comes back;
# /tmp/device-out elsewhere).
# REHEARSE=1 runs the same on this machine's CPU in tiny sizes, with the project's .venv
# (PROJECT_VENV, default .venv) beneath the carried wheels.
set -u
T0=$SECONDS
say() { echo "[$((SECONDS - T0)) s] $*"; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/device-out}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT" "$SITE"
cd "$REPO" || exit 1
if [[ ${REHEARSE:-0} == 1 ]]; then
  PY=${PROJECT_VENV:-$REPO/.venv}/bin/python
  GPU_ARGS=(--smoke) CLIENTS_ARGS=(--device cpu --model mlp --rounds 2)
else
  PY=python3
  GPU_ARGS=() CLIENTS_ARGS=(--device cuda --model resnet18_gn --input-size 128 --rounds 3)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
say "$(nproc) cores; installing $(ls .whl/*.whl | wc -l) wheels into $SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" --find-links .whl -r .whl/requirements.txt >"$OUT/pip.log" 2>&1 \
  || { say "pip install failed"; tail -5 "$OUT/pip.log"; exit 3; }
MPICH=$SITE/mpich-data
"$PY" -c "import sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
wheel.extractall(sys.argv[2], [n for n in wheel.namelist() if '.data/data/' in n])" \
  .whl/mpich-*.whl "$MPICH" || exit 3
MPICH=$(echo "$MPICH"/mpich-*.data/data)
chmod +x "$MPICH"/bin/*
export PATH=$MPICH/bin:$PATH LD_LIBRARY_PATH=$MPICH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 DO_NOT_TRACK=1
"$PY" -c "import torch, opacus, pydantic, h5py, openslide, tiffslide, imagecodecs, skimage
import safetensors, psutil, filelock, rich, jinja2, yaml
from mpi4py import MPI
import proxyfl.run, proxyfl.launch.job, bench.bench_gpu, bench.bench_clients
print('imports ok; torch', torch.__version__, 'cuda', torch.cuda.is_available(), '|',
      MPI.Get_library_version().splitlines()[0])" || { say "imports failed"; exit 3; }

say "(1) python -m bench gpu ${GPU_ARGS[*]} --skip-determinism"
timeout -s INT -k 20 "${GPU_S:-360}" "$PY" -m bench gpu "${GPU_ARGS[@]}" --skip-determinism \
  --work /tmp/bench-gpu --json "$OUT/gpu.json" 2>&1 | tee "$OUT/gpu.log"
say "(1) exit ${PIPESTATUS[0]}"
for file in /tmp/bench-gpu/runs/base/ranks/rank_0.machine.json /tmp/bench-gpu/runs/base/run.json; do
  [[ -f $file ]] && cp "$file" "$OUT/base.$(basename "$file")"
done

say "(2) python -m bench clients ${CLIENTS_ARGS[*]}: 8 clients on 1 rank, then a rank each"
timeout -s INT -k 20 "${CLIENTS_S:-150}" "$PY" -m bench clients "${CLIENTS_ARGS[@]}" \
  --clients 8 --ranks 1 --same-bytes 0 --work /tmp/bench-clients --json "$OUT/clients.json" \
  2>&1 | tee "$OUT/clients.log"
say "(2) exit ${PIPESTATUS[0]}"
say "done; files in $OUT"
