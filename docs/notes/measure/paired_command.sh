#!/usr/bin/env bash
# One command on two commits, interleaved (A B, B A, A B, ...), ROUNDS pairs: each run's wall seconds, exit
# code and busy core-seconds (the whole machine's, from /proc/stat: the ranks, forked by a fork server that
# outlives the command's own accounting, count), and each pair's ratio B/A; then the median ratio and its
# spread. Run from the repository root with its .venv; the command runs in a worktree of each commit, with
# PYTHONPATH set to it and $PY the root's .venv python:
#
#     bash docs/notes/measure/paired_command.sh BEFORE AFTER ROUNDS -- COMMAND...
#     bash docs/notes/measure/paired_command.sh main HEAD 5 -- sh -c '$PY -m pytest examples/test_loops.py -q -p no:cacheprovider'
#
# Each run's output goes to $PAIRED_LOGS/pair<i>-<A|B>.log (default a folder under /tmp, named at the start).
# Take the quiet lock around it for a timing (nothing else running): /tmp/meas/quiet.sh bash ... here; or,
# for runs too long to hold it through a whole pair, around each run: PAIRED_EACH=/tmp/meas/quiet.sh
# (a command each run is started through; its own waiting is not counted).
set -euo pipefail
before=$1 after=$2 rounds=$3
shift 3
[ "${1:-}" = "--" ] && shift
root=$(pwd)
work=$(mktemp -d)
logs=${PAIRED_LOGS:-$(mktemp -d /tmp/paired-logs.XXXX)}
mkdir -p "$logs"
trap 'git -C "$root" worktree remove --force "$work/a" 2>/dev/null; git -C "$root" worktree remove --force "$work/b" 2>/dev/null; rm -rf "$work"' EXIT
git worktree add -q --detach "$work/a" "$before"
git worktree add -q --detach "$work/b" "$after"
busy() {  # the machine's busy core-seconds so far
  awk -v hz="$(getconf CLK_TCK)" '/^cpu /{print ($2+$3+$4+$7+$8+$9)/hz}' /proc/stat
}
run_in() {  # run_in TREE LOG COMMAND... -> "seconds exit busy-core-seconds"
  local tree=$1 log=$2 start end code b0 b1; shift 2
  if [ -n "${PAIRED_EACH:-}" ]; then  # the wrapper's wait is outside the figures: timed inside it
    (cd "$tree" && LOG="$log" PYTHONPATH="$tree" PY="$root/.venv/bin/python" $PAIRED_EACH bash -c '
      b() { awk -v hz="$(getconf CLK_TCK)" "/^cpu /{print (\$2+\$3+\$4+\$7+\$8+\$9)/hz}" /proc/stat; }
      s=$(date +%s.%N); b0=$(b); "$@" > "$LOG" 2>&1; c=$?; e=$(date +%s.%N); b1=$(b)
      echo "$(echo "$e - $s" | bc) $c $(echo "$b1 - $b0" | bc)" > "$LOG.fig"' _ "$@") > "$log.wait" 2>&1 || true
    cat "$log.fig"; return
  fi
  start=$(date +%s.%N); b0=$(busy)
  (cd "$tree" && PYTHONPATH="$tree" PY="$root/.venv/bin/python" "$@" > "$log" 2>&1) && code=0 || code=$?
  end=$(date +%s.%N); b1=$(busy)
  echo "$(echo "$end - $start" | bc) $code $(echo "$b1 - $b0" | bc)"
}
echo "logs: $logs"
echo "$*: A = $before ($(git rev-parse --short "$before")), B = $after ($(git rev-parse --short "$after")), $rounds pairs; load $(cut -d' ' -f1-3 /proc/loadavg)"
ratios=()
for i in $(seq 1 "$rounds"); do
  if [ $((i % 2)) -eq 1 ]; then a=$(run_in "$work/a" "$logs/pair$i-A.log" "$@"); b=$(run_in "$work/b" "$logs/pair$i-B.log" "$@")
  else b=$(run_in "$work/b" "$logs/pair$i-B.log" "$@"); a=$(run_in "$work/a" "$logs/pair$i-A.log" "$@"); fi
  read -r aw ae ab <<< "$a"; read -r bw be bb <<< "$b"
  rw=$(echo "scale=3; $bw / $aw" | bc); rb=$(echo "scale=3; $bb / $ab" | bc)
  ratios+=("$rw $rb")
  echo "pair $i ($([ $((i % 2)) -eq 1 ] && echo "A first" || echo "B first")): A ${aw} s (exit $ae, ${ab} core-s), B ${bw} s (exit $be, ${bb} core-s), B/A wall $rw, busy $rb; load $(cut -d' ' -f1-3 /proc/loadavg)"
done
printf '%s\n' "${ratios[@]}" | python3 -c '
import sys, statistics
rows = [tuple(map(float, line.split())) for line in sys.stdin if line.strip()]
for k, name in enumerate(("wall", "busy")):
    xs = sorted(r[k] for r in rows)
    print(f"B/A {name}: median {statistics.median(xs):.3f}, min {xs[0]:.3f}, max {xs[-1]:.3f} ({len(xs)} pairs)")
'
