#!/usr/bin/env bash
# Writes each example's diffs: adapt.diff, `diff -u` of every file in its original/ (as fetched) against the
# adapted file beside it; fix.diff, the adapted script against the user's next step after the check's verdict.
set -u
cd "$(dirname "$0")"
for dir in */; do
    dir=${dir%/}
    [ -d "$dir/original" ] || continue
    : > "$dir/adapt.diff"
    (cd "$dir" && find original -type f | sort | while read -r orig; do
        adapted=${orig#original/}
        diff -u --label "$orig" --label "$adapted" "$orig" "$adapted" >> adapt.diff
    done)
done
for pair in fsdp2:example.py:example_init.py fabric_mnist:train_fabric.py:train_fabric_ddp.py accelerate_cv:cv_example.py:cv_example_batch_arg.py; do
    IFS=: read -r dir adapted next <<< "$pair"
    (cd "$dir" && diff -u --label "$adapted" --label "$next" "$adapted" "$next" > fix.diff)
done
exit 0
