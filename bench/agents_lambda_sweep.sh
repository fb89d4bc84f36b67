#!/usr/bin/env bash
# Lambda for CAMAL on the critic, chosen on training runs only (issue 37): seeds 11 and 12 (never used by the
# evaluated runs, seeds 1-5), lambda 0 / 0.3 / 1 / 3, 20,480 environment steps each, the CPU-sized CNN of
# bench/agents_cpu_run.sh, all eight runs side by side at one thread. No held-out episode is played.
# The rule, fixed before the runs: among lambda > 0, the highest mean training-frame IoU at the end of training
# (over the two seeds) whose mean final return_100 (mean return of the last 100 training episodes) is at least
# vanilla's minus 0.5; if none is, the lambda with the highest return_100. bench/agents_lambda_pick.py applies it.
# Usage: WORK=/tmp/agents-lambda bash bench/agents_lambda_sweep.sh
set -u
WORK=${WORK:?}; STEPS=${STEPS:-20480}; PY=${PYTHON:-python}
mkdir -p "$WORK/weights" "$WORK/logs"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
{ date -u; nproc; uptime; echo "steps=$STEPS seeds=11 12 lambdas=0 0.3 1 3 width=8 hidden=64 num_envs=4 rollout=128 minibatch=128"; } > "$WORK/logs/machine.txt"
for seed in 11 12; do
  for lam in 0 0.3 1 3; do
    nice -n 5 $PY -m explainers train-agent --scenario defend_the_center --seed "$seed" --lambda "$lam" \
      --steps "$STEPS" --num-envs 4 --rollout-steps 128 --minibatch 128 --width 8 --hidden 64 --device cpu \
      --out "$WORK/weights" --name "sweep-l$lam-s$seed" > "$WORK/logs/train-l$lam-s$seed.json" \
      2> "$WORK/logs/train-l$lam-s$seed.log" &
  done
done
wait
echo "trained $(date -u)" >> "$WORK/logs/machine.txt"
