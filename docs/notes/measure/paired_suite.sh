#!/usr/bin/env bash
# One pytest selection on two commits, interleaved (A B, B A, A B, ...), ROUNDS pairs: each run's wall
# seconds and exit code, and each pair's ratio B/A. Run from the repository root with its .venv:
#
#     bash docs/notes/measure/paired_suite.sh BEFORE AFTER [ROUNDS] [PYTEST ARGS...]
#     bash docs/notes/measure/paired_suite.sh a289a3b HEAD 3 correctness -q -p no:cacheprovider
#
# Each commit is checked out in a temporary worktree, run with this checkout's .venv and PYTHONPATH set to
# the worktree (so the worktree's mgpu is the one imported, in the ranks too). Besides the wall seconds,
# each run's busy core-seconds (the whole machine's, from /proc/stat: the ranks' forked processes count,
# which /usr/bin/time misses) and its log: $PAIRED_LOGS/pair<i>-<A|B>.log (default a folder under /tmp, named
# at the start). Add --durations=0 to the pytest args to compare test by test (durations_diff.py).
set -euo pipefail
before=$1 after=$2 rounds=${3:-3}
shift 3 || shift $#
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(correctness -q -p no:cacheprovider)
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
run() {  # run TREE LOG -> "seconds exit busy-core-seconds"
  local start end code b0 b1
  start=$(date +%s.%N); b0=$(busy)
  (cd "$1" && PYTHONPATH="$1" "$root/.venv/bin/python" -m pytest "${args[@]}" > "$2" 2>&1) && code=0 || code=$?
  end=$(date +%s.%N); b1=$(busy)
  echo "$(echo "$end - $start" | bc) $code $(echo "$b1 - $b0" | bc)"
}
echo "logs: $logs"
echo "pytest ${args[*]}: A = $before ($(git rev-parse --short "$before")), B = $after ($(git rev-parse --short "$after")), $rounds pairs; load $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 1 "$rounds"); do
  if [ $((i % 2)) -eq 1 ]; then a=$(run "$work/a" "$logs/pair$i-A.log"); b=$(run "$work/b" "$logs/pair$i-B.log")
  else b=$(run "$work/b" "$logs/pair$i-B.log"); a=$(run "$work/a" "$logs/pair$i-A.log"); fi
  read -r aw ae ab <<< "$a"; read -r bw be bb <<< "$b"
  echo "pair $i: A ${aw} s (exit $ae, ${ab} core-s), B ${bw} s (exit $be, ${bb} core-s), B/A wall $(echo "scale=3; $bw / $aw" | bc), busy $(echo "scale=3; $bb / $ab" | bc); load $(cut -d' ' -f1-3 /proc/loadavg)"
done
