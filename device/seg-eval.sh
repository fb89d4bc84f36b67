#!/usr/bin/env bash
# Evaluate the bundled segmentation model's explanations on a GPU machine (weights/bccd-segformer.* committed).
#   bash device/seg-eval.sh [DATA] [TEST_BUDGET_S]
# 1. bench/seg_select_val.py: GradSkip's options chosen on the val split (60 s budget, named images);
# 2. evaluate-seg on the test split: GradSkip (chosen options) and every baseline, curves K = 20 (TEST_BUDGET_S,
#    default 270 s: images in split order until the budget is spent; the report names them);
# 3. bench/seg_cost.py: GradSkip vs its floor and vs pytorch-grad-cam's Seg-Grad-CAM, and their agreement.
# Writes under $OUT: seg-gradskip-val.json, seg-eval-test.json, seg-cost.json, seg-eval.log.
set -euo pipefail
DATA=${1:-seg-data}
BUDGET=${2:-270}
METHODS=${METHODS:-seggradcam,gradrollout,rollout,occlusion,rise,aha,random}  # the baselines (GradSkip is added)
LIMIT_ARGS=${LIMIT:+--limit $LIMIT}  # LIMIT=N: the first N images of each split (a toy run)
VAL_BUDGET=${VAL_BUDGET:-60}
OUT=${OUT:-/tmp/seg-eval-out}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1
[ -f weights/bccd-segformer.safetensors ] || { echo "weights/bccd-segformer.safetensors is missing" >&2; exit 2; }
[ -f "$DATA/splits.json" ] || { echo "no prepared data at $DATA" >&2; exit 2; }
{
  "$PYTHON" bench/seg_select_val.py --data "$DATA" --out "$OUT/seg-gradskip-val.json" --time-budget-s "$VAL_BUDGET" \
    $LIMIT_ARGS
  CHOSEN=$("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['chosen'])" "$OUT/seg-gradskip-val.json")
  OPTIONS=$("$PYTHON" -c "import json,sys; from explainers.evaluate import parse_method_spec; print(json.dumps(parse_method_spec('gradskip:' + sys.argv[1])[1]))" "$CHOSEN")
  echo "chosen on val: $CHOSEN"
  "$PYTHON" -m explainers.segmentation.cli evaluate-seg --data "$DATA" --split test \
    --methods "gradskip:$CHOSEN,$METHODS" --out "$OUT/seg-eval-test.json" --time-budget-s "$BUDGET" $LIMIT_ARGS \
    --curve-steps "${CURVE_STEPS:-20}"
  "$PYTHON" bench/seg_cost.py --data "$DATA" --out "$OUT/seg-cost.json" --options "$OPTIONS" ${COST_ARGS:-}
} 2>&1 | tee "$OUT/seg-eval.log"
ls -la "$OUT"
