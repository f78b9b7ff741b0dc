#!/usr/bin/env bash
# Issue 53's root cause, counted: `mgpu train --strategy fsdp` at 2 ranks under plain torchrun, N runs of each tree
# interleaved (BEFORE: a checkout without the fix; AFTER: this one), each run's exit code and whether a rank aborted
# with gloo's "terminate called without an active exception" at interpreter exit. Beside a CPU burner with BURN=1.
#   BEFORE=/tmp/before AFTER=. N=20 BURN=1 bash docs/notes/measure/torchrun_exit.sh
set -u
PY=${PY:-.venv/bin/python}; N=${N:-20}
[ "${BURN:-0}" = 1 ] && { for c in $(seq "$(nproc)"); do (while :; do :; done) & done; trap 'kill $(jobs -p) 2>/dev/null' EXIT; }
declare -A aborts=( [before]=0 [after]=0 ) reds=( [before]=0 [after]=0 )
for i in $(seq "$N"); do
  for tree in before after; do
    dir=$([ $tree = before ] && echo "$BEFORE" || echo "$AFTER")
    log=$(mktemp)
    (cd "$dir" && timeout 300 "$OLDPWD/$PY" -m torch.distributed.run --nproc-per-node 2 --master-port $((20000 + RANDOM % 20000)) \
      -m mgpu train --strategy fsdp --devices 2 --model lenet --epochs 1 --batch-size 25 --train-size 100 --test-size 50 \
      --no-progress) >"$log" 2>&1
    rc=$?
    grep -q "terminate called" "$log" && aborts[$tree]=$(( ${aborts[$tree]} + 1 ))
    [ $rc != 0 ] && reds[$tree]=$(( ${reds[$tree]} + 1 ))
    echo "run $i $tree: exit $rc$(grep -q 'terminate called' "$log" && echo ', a rank aborted: terminate called')"
    rm -f "$log"
  done
done
echo "before: ${aborts[before]} aborted, ${reds[before]} non-zero of $N; after: ${aborts[after]} aborted, ${reds[after]} non-zero of $N"
