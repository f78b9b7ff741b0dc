#!/usr/bin/env bash
# One pytest selection on two commits, interleaved (A B, B A, A B, ...), ROUNDS pairs: each run's wall
# seconds and exit code, and each pair's ratio B/A. Run from the repository root with its .venv:
#
#     bash docs/notes/measure/paired_suite.sh BEFORE AFTER [ROUNDS] [PYTEST ARGS...]
#     bash docs/notes/measure/paired_suite.sh a289a3b HEAD 3 correctness -q -p no:cacheprovider
#
# Each commit is checked out in a temporary worktree, run with this checkout's .venv and PYTHONPATH set to
# the worktree (so the worktree's mgpu is the one imported, in the ranks too).
set -euo pipefail
before=$1 after=$2 rounds=${3:-3}
shift 3 || shift $#
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(correctness -q -p no:cacheprovider)
root=$(pwd)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/a" 2>/dev/null; git -C "$root" worktree remove --force "$work/b" 2>/dev/null; rm -rf "$work"' EXIT
git worktree add -q --detach "$work/a" "$before"
git worktree add -q --detach "$work/b" "$after"
run() {  # run TREE -> "seconds exit"
  local start end code
  start=$(date +%s.%N)
  (cd "$1" && PYTHONPATH="$1" "$root/.venv/bin/python" -m pytest "${args[@]}" > "$work/last.log" 2>&1) && code=0 || code=$?
  end=$(date +%s.%N)
  echo "$(echo "$end - $start" | bc) $code"
}
echo "pytest ${args[*]}: A = $before ($(git rev-parse --short "$before")), B = $after ($(git rev-parse --short "$after")), $rounds pairs; load $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 1 "$rounds"); do
  if [ $((i % 2)) -eq 1 ]; then a=$(run "$work/a"); b=$(run "$work/b"); else b=$(run "$work/b"); a=$(run "$work/a"); fi
  ratio=$(echo "scale=3; ${b%% *} / ${a%% *}" | bc)
  echo "pair $i: A ${a%% *} s (exit ${a##* }), B ${b%% *} s (exit ${b##* }), B/A $ratio; load $(cut -d' ' -f1-3 /proc/loadavg)"
done
