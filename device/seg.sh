#!/usr/bin/env bash
# Train the bundled segmentation model (bccd-segformer) on a GPU machine.
#   bash device/seg.sh [DATA] [BUDGET_S]
# DATA: a prepared BCCD folder (python -m explainers.segmentation.bccd ...), default seg-data/ in the repo root.
# BUDGET_S: training wall seconds (default 330, about 5.5 minutes); validation, export and the test IoU add ~20 s.
# Writes under $OUT (default /tmp/seg-out): bccd-segformer.safetensors (~7.5 MB), bccd-segformer.json (card),
# bccd-segformer-curve.jsonl (validation curve), train-seg.log, env.txt. Nothing is downloaded.
set -euo pipefail
DATA=${1:-seg-data}
BUDGET=${2:-330}
OUT=${OUT:-/tmp/seg-out}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1
if [ ! -f "$DATA/splits.json" ]; then
  echo "no prepared data at $DATA (splits.json missing): prepare it first (device/segmentation.md)" >&2
  exit 2
fi
{
  date -u
  nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv || true
  "$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
# the checkpoint folder is outside $OUT (60 MB, not wanted back); rerunning the same command resumes it
"$PYTHON" -m explainers.segmentation.cli train-seg --data "$DATA" --out "$OUT" --work /tmp/seg-work \
  --budget-s "$BUDGET" --threads 2 2>&1 | tee "$OUT/train-seg.log"
ls -la "$OUT"
