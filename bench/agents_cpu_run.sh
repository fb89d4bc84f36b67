#!/usr/bin/env bash
# The CPU fallback of device/agents.sh (the GPU run could not happen): 5 seeds x {vanilla, CAMAL lambda 1.0} on
# defend_the_center with a CPU-sized CNN (width 8, hidden 64), all 10 runs in parallel at nice 10, the same step
# cap for both arms (a time budget only as a safety net), then each pair on 10 held-out episode seeds.
# Usage: WORK=/tmp/cpu-run STEPS=20480 BUDGET=1800 bash bench/agents_cpu_run.sh
set -u
WORK=${WORK:?}; STEPS=${STEPS:-20480}; BUDGET=${BUDGET:-1800}; LAMBDA=${LAMBDA:-1.0}; PY=${PYTHON:-python}
mkdir -p "$WORK/weights" "$WORK/logs"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
{ date -u; nproc; uptime; echo "lambda=$LAMBDA steps=$STEPS budget_s=$BUDGET seeds=1 2 3 4 5 episodes=10 device=cpu width=8 hidden=64 num_envs=4 rollout=128 minibatch=128 epochs=4"; } > "$WORK/logs/machine.txt"
for seed in 1 2 3 4 5; do
  for arm in vanilla camal; do
    lam=0; [ "$arm" = camal ] && lam=$LAMBDA
    nice -n 10 $PY -m explainers train-agent --scenario defend_the_center --seed "$seed" --lambda "$lam" \
      --steps "$STEPS" --budget-s "$BUDGET" --num-envs 4 --rollout-steps 128 --minibatch 128 --width 8 --hidden 64 \
      --device cpu --out "$WORK/weights" --name "dtc-$arm-s$seed" \
      > "$WORK/logs/train-$arm-s$seed.json" 2> "$WORK/logs/train-$arm-s$seed.log" &
  done
done
wait
echo "trained $(date -u)" >> "$WORK/logs/machine.txt"
# the time budget may stop the two arms of a seed at different steps (a CAMAL update costs more): the one behind
# resumes from its checkpoint up to the other's steps, so both arms of a seed train for the same steps
for seed in 1 2 3 4 5; do
  target=$($PY -c "import json,sys; print(max(json.load(open(f'$WORK/weights/dtc-{a}-s$seed.json'))['steps'] for a in ('vanilla','camal')))")
  for arm in vanilla camal; do
    have=$($PY -c "import json; print(json.load(open('$WORK/weights/dtc-$arm-s$seed.json'))['steps'])")
    lam=0; [ "$arm" = camal ] && lam=$LAMBDA
    if [ "$have" -lt "$target" ]; then
      nice -n 10 $PY -m explainers train-agent --scenario defend_the_center --seed "$seed" --lambda "$lam" \
        --steps "$target" --num-envs 4 --rollout-steps 128 --minibatch 128 --width 8 --hidden 64 --device cpu \
        --out "$WORK/weights" --name "dtc-$arm-s$seed" >> "$WORK/logs/train-$arm-s$seed.json" \
        2>> "$WORK/logs/train-$arm-s$seed.log" &
    fi
  done
done
wait
echo "topped up $(date -u)" >> "$WORK/logs/machine.txt"
for seed in 1 2 3 4 5; do
  nice -n 10 $PY -m explainers evaluate-agent --agents "$WORK/weights/dtc-vanilla-s$seed.json" \
    "$WORK/weights/dtc-camal-s$seed.json" --episodes 10 --device cpu --out "$WORK/eval-s$seed.json" \
    > "$WORK/logs/eval-s$seed.log" 2>&1 &
done
wait
echo "evaluated $(date -u)" >> "$WORK/logs/machine.txt"
