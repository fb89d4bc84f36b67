#!/usr/bin/env bash
# Agents on the GPU machine: train 5 seeds x 2 arms (vanilla PPO, PPO + CAMAL) on defend_the_center in parallel,
# evaluate every vanilla/CAMAL pair on held-out episode seeds, pack one tar into $OUT.
# Run from the repository root with OUT set (PYTHONPATH holding vizdoom, gymnasium). AGENTS_TOY=1: 20 s, 1 seed.
set -u
: "${OUT:?set OUT to the output folder}"
PY=${PYTHON:-python}
TOY=${AGENTS_TOY:-0}
LAMBDA=${AGENTS_LAMBDA:-1.0}
DEVICE=${AGENTS_DEVICE:-auto}
if [ "$TOY" = "1" ]; then BUDGET=20; SEEDS="1"; EPISODES=2; else BUDGET=${AGENTS_BUDGET:-270}; SEEDS="1 2 3 4 5"; EPISODES=10; fi
WORK=$(mktemp -d)/agents
mkdir -p "$WORK/weights" "$WORK/logs"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
T0=$(date +%s)
{ date -u; nproc; $PY -c "import torch, vizdoom, gymnasium; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'vizdoom', vizdoom.__version__, 'gymnasium', gymnasium.__version__)"; nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null; } > "$WORK/logs/machine.txt" 2>&1
echo "lambda=$LAMBDA budget_s=$BUDGET seeds=$SEEDS episodes=$EPISODES device=$DEVICE toy=$TOY" >> "$WORK/logs/machine.txt"
for seed in $SEEDS; do
  for arm in vanilla camal; do
    lam=0; [ "$arm" = camal ] && lam=$LAMBDA
    $PY -m explainers train-agent --scenario defend_the_center --seed "$seed" --lambda "$lam" --budget-s "$BUDGET" \
      --num-envs 8 --device "$DEVICE" --out "$WORK/weights" --name "dtc-$arm-s$seed" \
      > "$WORK/logs/train-$arm-s$seed.json" 2> "$WORK/logs/train-$arm-s$seed.log" &
  done
done
wait
echo "trained in $(( $(date +%s) - T0 )) s" >> "$WORK/logs/machine.txt"
for seed in $SEEDS; do
  $PY -m explainers evaluate-agent --agents "$WORK/weights/dtc-vanilla-s$seed.json" "$WORK/weights/dtc-camal-s$seed.json" \
    --episodes "$EPISODES" --device "$DEVICE" --out "$WORK/eval-s$seed.json" > "$WORK/logs/eval-s$seed.log" 2>&1 &
done
wait
echo "evaluated; total $(( $(date +%s) - T0 )) s" >> "$WORK/logs/machine.txt"
if [ "$TOY" = "1" ]; then COST="--repeats 1 --num-envs 2 --rollout-steps 64"; else COST="--repeats 3"; fi
BENCH_DEVICE=$DEVICE; [ "$DEVICE" = auto ] && BENCH_DEVICE=$($PY -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
timeout 45 $PY bench/agents_cost.py --device "$BENCH_DEVICE" $COST --out "$WORK/agents-cost.json" > "$WORK/logs/cost.log" 2>&1
echo "cost bench rc=$?; total $(( $(date +%s) - T0 )) s" >> "$WORK/logs/machine.txt"
rm -f "$WORK"/weights/*.ckpt.safetensors  # the Adam moments triple the size; the final weights are kept
tar cf "$OUT/agents-results.tar" -C "$WORK" .
ls -la "$OUT/agents-results.tar"
tail -n 3 "$WORK"/logs/*.log
cat "$WORK/logs/machine.txt"
