#!/usr/bin/env bash
# Start or resume the agents' comparison (bench/agents_comparison.py: the recipe chosen by the gate, 5 training
# seeds x {vanilla, CAMAL}, 100 held-out episodes each, the results file). The same command continues from the
# checkpoints in WORK; --stop-at HH:MM (UTC) or SIGTERM stops the runs with a checkpoint. WORK and the logs are in the
# tree so that a stop's checkpoints and logs can be committed (a machine's /tmp does not outlive the session).
# Usage: bash bench/agents_comparison.sh [--stop-at 22:20] [--clip-sweep | --camal-clip C]
#        (WORK=bench/agents-runs/comparison-hud, logs in bench/agents-runs/logs by default)
set -eu
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1 PYTHONPATH=.
exec "${PYTHON:-python}" bench/agents_comparison.py --work "${WORK:-bench/agents-runs/comparison-hud}" --parallel 2 "$@"
