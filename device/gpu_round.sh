#!/usr/bin/env bash
# One GPU lease for the trainings that a 2-core CPU cannot do: the agents (5 seeds x vanilla/CAMAL, ViZDoom
# defend_the_center), the bundled SegFormer on BCCD, AHA's class-following explainers, and the held-out
# scoreboard; side by side, each with its own OUT and log, stopped by a watchdog at DEADLINE_S, each OUT packed
# into one tar under $OUT. Run from the repository root with the data under .devdata/ (each part's needs: device/README.md).
set -u
cd "$(dirname "$0")/.."
DEADLINE_S=${DEADLINE_S:-545}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHON=${PYTHON:-python3}
if [ -f .devdata/site312.tar.xz ]; then  # vizdoom + gymnasium wheels, unpacked (the machine has no network)
  mkdir -p /tmp/site && tar -C /tmp/site -xJf .devdata/site312.tar.xz
  export PYTHONPATH="/tmp/site:$PWD:${PYTHONPATH:-}"
else
  export PYTHONPATH="$PWD:${PYTHONPATH:-}"
fi
real_out="$OUT"
nvidia-smi > "$real_out/gpu.txt" 2>&1; nproc >> "$real_out/gpu.txt"
start=$(date +%s)
declare -A cmd=(
  [agents]="AGENTS_BUDGET=${AGENTS_BUDGET:-240} bash device/agents.sh"
  [seg]="bash device/seg.sh .devdata/bccd-seg ${SEG_BUDGET:-300}"
  [aha]="bash device/aha.sh .devdata/bloodmnist/train .devdata/bloodmnist/val ${AHA_BUDGET:-3.0}"
  [scoreboard]="PROCS=${SB_PROCS:-6} ROAD_CELLS=${ROAD_CELLS:-60} bash device/scoreboard.sh .devdata/bloodmnist-test"
)
parts=${PARTS:-"agents seg aha scoreboard"}
declare -A pid
for part in $parts; do
  mkdir -p "/tmp/out/$part"
  setsid bash -c "OUT=/tmp/out/$part ${cmd[$part]}" > "/tmp/out/$part/run.log" 2>&1 &
  pid[$part]=$!
done
while true; do
  running=""
  for part in $parts; do kill -0 "${pid[$part]}" 2>/dev/null && running="$running $part"; done
  now=$(( $(date +%s) - start ))
  [ -z "$running" ] && break
  if [ $now -ge "$DEADLINE_S" ]; then
    echo "[$now s] deadline: stopping$running"
    for part in $running; do kill -TERM -- -"${pid[$part]}" 2>/dev/null; done
    sleep 5
    for part in $running; do kill -KILL -- -"${pid[$part]}" 2>/dev/null; done
    break
  fi
  echo "[$now s] running:$running"
  sleep 30
done
for part in $parts; do
  tar -C /tmp/out -cf "$real_out/$part.tar" "$part"
  echo "== $part ($(du -h "$real_out/$part.tar" | cut -f1))"; tail -4 "/tmp/out/$part/run.log"
done
echo "round done in $(( $(date +%s) - start )) s"
