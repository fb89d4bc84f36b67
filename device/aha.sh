#!/usr/bin/env bash
# Class-following AHA explainers (issue 39 item 3) on one GPU, about 5 minutes wall:
#   bash device/aha.sh [TRAIN_DIR] [VAL_DIR] [BUDGET_MINUTES]
# Four runs side by side (bloodmnist-vit and bloodmnist-vit-grid, each with the log-probability and with the logit
# margin as the score of the non-top targets), each warm-started from the shipped aha-bloodmnist-vit, time-budgeted,
# its checkpoint chosen on VAL_DIR by the class-following rule (docs/aha-explainers.md); then bench/aha_pick.py keeps,
# per model, the run the same rule ranks first. Writes under $OUT: aha-bloodmnist-vit{,-grid}.{safetensors,json,
# validation.png}, and runs.tar (every run's log and card).
set -u
cd "$(dirname "$0")/.."
TRAIN=${1:-.devdata/bloodmnist/train}
VAL=${2:-.devdata/bloodmnist/val}
BUDGET=${3:-3.4}
OUT=${OUT:-/tmp/aha-out}
PY=${PYTHON:-python}
# sizes (the defaults are the GPU run's; a CPU smoke test sets smaller ones)
VIT_TRACK=${VIT_TRACK:-128}; GRID_TRACK=${GRID_TRACK:-64}; VAL_LIMIT=${VAL_LIMIT:-256}; VAL_MOSAICS=${VAL_MOSAICS:-64}
VIT_BATCH=${VIT_BATCH:-32}; GRID_BATCH=${GRID_BATCH:-16}; VAL_EVERY=${VAL_EVERY:-40}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/aha-runs.XXXXXX)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
for dir in "$TRAIN" "$VAL"; do
  [ -f "$dir/labels.csv" ] || { echo "no labels.csv in $dir"; exit 2; }
done
echo "train $(($(wc -l < "$TRAIN/labels.csv") - 1)) images, val $(($(wc -l < "$VAL/labels.csv") - 1)); budget $BUDGET min per run"
common=(--data "$TRAIN" --val-data "$VAL" --steps 100000 --time-budget-minutes "$BUDGET" --time-schedule
        --targets varied --class-input token_logits --select-rule class-following --init weights/aha-bloodmnist-vit
        --mosaic-classes 2 --class-input-lr-scale 10 --val-every "$VAL_EVERY" --log-every 10 --checkpoint-every 100000 --val-limit "$VAL_LIMIT"
        --val-mosaics "$VAL_MOSAICS")
pids=()
for score in logprob margin; do
  $PY -m explainers train-aha --model bloodmnist-vit "${common[@]}" --score $score --batch-size "$VIT_BATCH" --mosaic-every 3 \
      --val-track "$VIT_TRACK" --val-rho-max 0.5 --compare rollout,gradcam --out "$WORK/vit-$score/aha-bloodmnist-vit" \
      > "$WORK/vit-$score.log" 2>&1 &
  pids+=($!)
  $PY -m explainers train-aha --model bloodmnist-vit-grid "${common[@]}" --score $score --batch-size "$GRID_BATCH" --mosaic-every 2 \
      --val-track "$GRID_TRACK" --val-gridpg-min 0.526 --compare rollout --out "$WORK/grid-$score/aha-bloodmnist-vit-grid" \
      > "$WORK/grid-$score.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || echo "a run exited with $?"; done
for run in vit-logprob vit-margin grid-logprob grid-margin; do
  echo "== $run"; tr '\r' '\n' < "$WORK/$run.log" | grep -E "^step|validation floor|Error|error|Traceback" | tail -12
done
$PY bench/aha_pick.py --out "$OUT" --model bloodmnist-vit "$WORK/vit-logprob/aha-bloodmnist-vit" "$WORK/vit-margin/aha-bloodmnist-vit"
$PY bench/aha_pick.py --out "$OUT" --model bloodmnist-vit-grid "$WORK/grid-logprob/aha-bloodmnist-vit-grid" \
    "$WORK/grid-margin/aha-bloodmnist-vit-grid"
find "$WORK" -name "*.ckpt" -delete
tar -C "$WORK" -cf "$OUT/runs.tar" --exclude="*.safetensors" .
ls -la "$OUT"
