#!/usr/bin/env bash
# Evaluate the bundled segmentation model's explanations on a GPU machine (weights/bccd-segformer.* committed).
#   bash device/seg-eval.sh [DATA] [TEST_BUDGET_S]
# 1. bench/seg_select_val.py: GradSkip's options chosen on the first VAL_LIMIT val smears (default 8) by the rule
#    in its docstring (randomisation gate, then out-of-region deletion);
# 2. bench/seg_context_eval.py on the test split less the twin smears, then on the twins apart: GradSkip (chosen
#    options), the rollouts and Grad-CAM, the answer rows and the orders that need no map (TEST_BUDGET_S, default
#    270 s: smears in name order until the budget is spent; the records name them); bench/seg_context_table.py;
# 3. bench/seg_cost.py: GradSkip vs its floor and vs pytorch-grad-cam's Seg-Grad-CAM, and their agreement.
# Writes under $OUT: seg-gradskip-val.json, seg-context-test.jsonl/.md, seg-context-twins.jsonl, seg-cost.json,
# seg-eval.log.
set -euo pipefail
DATA=${1:-seg-data}
BUDGET=${2:-270}
VAL_LIMIT=${VAL_LIMIT:-8}
OUT=${OUT:-/tmp/seg-eval-out}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1 PYTHONPATH=.
[ -f weights/bccd-segformer.safetensors ] || { echo "weights/bccd-segformer.safetensors is missing" >&2; exit 2; }
[ -f "$DATA/splits.json" ] || { echo "no prepared data at $DATA" >&2; exit 2; }
{
  "$PYTHON" bench/seg_select_val.py --data "$DATA" --out "$OUT/seg-gradskip-val.json" --limit "$VAL_LIMIT"
  OPTIONS=$("$PYTHON" -c "import json,sys; chosen = json.load(open(sys.argv[1]))['chosen']; print(json.dumps(dict(kv.split('=') for kv in chosen.split(','))))" "$OUT/seg-gradskip-val.json")
  echo "chosen on val: $OPTIONS"
  "$PYTHON" bench/seg_context_eval.py --data "$DATA" --split test --gradskip-options "$OPTIONS" \
    --out "$OUT/seg-context-test.jsonl" --time-budget-s "$BUDGET" --steps "${STEPS:-10}"
  "$PYTHON" bench/seg_context_eval.py --data "$DATA" --split test --twins --gradskip-options "$OPTIONS" \
    --out "$OUT/seg-context-twins.jsonl" --steps "${STEPS:-10}"
  "$PYTHON" bench/seg_context_table.py "$OUT/seg-context-test.jsonl" --out "$OUT/seg-context-test.md"
  "$PYTHON" bench/seg_cost.py --data "$DATA" --out "$OUT/seg-cost.json" --options "$OPTIONS" ${COST_ARGS:-}
} 2>&1 | tee "$OUT/seg-eval.log"
ls -la "$OUT"
