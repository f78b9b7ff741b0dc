#!/usr/bin/env bash
# One command N times in a row, each in a fresh process: the count of each exit code and each run's last line.
#
#     bash docs/notes/measure/repeat_check.sh 20 .venv/bin/python -m mgpu check-script \
#         examples/loops/aug_torchvision.py --batch-size "{16 // world_size}" --workers 2
#
# Exit 0 when every run exited 0.
set -uo pipefail
n=$1; shift
declare -A codes
for i in $(seq 1 "$n"); do
  start=$(date +%s.%N)
  out=$("$@" 2>&1); code=$?
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  codes[$code]=$(( ${codes[$code]:-0} + 1 ))
  printf 'run %2d: exit %d, %5.1f s, load %s: %s\n' "$i" "$code" "$secs" "$(cut -d' ' -f1 /proc/loadavg)" "$(tail -n1 <<< "$out" | cut -c1-150)"
  [ "$code" -eq 0 ] || { echo "---- run $i's output:"; tail -n 30 <<< "$out"; echo "----"; }
done
summary=""
for c in "${!codes[@]}"; do summary+="exit $c: ${codes[$c]}  "; done
echo "$n runs: $summary"
[ "${codes[0]:-0}" -eq "$n" ]
