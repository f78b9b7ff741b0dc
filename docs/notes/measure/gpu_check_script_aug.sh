#!/usr/bin/env bash
# Issue 55 item 5, on a machine with one CUDA GPU (python3 with torch 2.11, from the repository root):
# check-script on one augmentation loop (torchvision v2 RandomCrop + flip in __getitem__, two DataLoader
# workers) and one bf16 loop (autocast bf16, AdamW, clipping), the model on CUDA; then the keying benchmark
# on this machine's CPU (the 2-core VM it was written on was never quiet).
#   bash docs/notes/measure/gpu_check_script_aug.sh     # about 1-2 minutes; at most 3 (each step bounded)
# With one GPU a world size above 1 runs with the GPUs hidden, on the CPU, and so does its world 1
# (docs/guide/check-script.md, "What runs"): the model is on CUDA only in `--ranks 1` checks, world 1's run A
# against its rerun B (keyed augmentation and the CUDA model must reproduce bitwise; bf16 adds the runs lifted
# to float32). One `--ranks 1,2` check of the aug loop runs the comparison itself (CPU, this machine).
# Expected: every check PASSED (exit 0), the aug loop's report with the note "random augmentation: ... keyed".
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:-/tmp/gpu-check-script-aug}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'cuda', torch.version.cuda, torch.cuda.device_count(), 'GPU(s)')"
uptime
status=0
check() {  # name, then check-script's arguments
  local name=$1; shift
  local start; start=$(date +%s%N)
  timeout 50 python3 -m mgpu check-script --timeout 40 --json "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $(( ($(date +%s%N) - start) / 1000000 )) ms"
  grep -E "^  (world|note|finding)|^(PASSED|FAILED|NOT VERIFIED)" "$OUT/$name.log" | cut -c1-400
  [ "$rc" = 0 ] || { status=1; tail -20 "$OUT/$name.log"; }
}
check aug_torchvision_cuda --ranks 1 examples/loops/aug_torchvision.py --batch-size "{16 // world_size}" --workers 2 --device auto
check ddp_amp_bf16_cuda --ranks 1 examples/loops/ddp_amp.py --batch-size "{48 // world_size}" --amp bf16
check aug_torchvision_1v2 --ranks 1,2 examples/loops/aug_torchvision.py --batch-size "{16 // world_size}" --workers 2
# what keying costs a loader (CPU, num_workers=0), on this machine while nothing else runs: interleaved pairs
echo "== keying's cost over a realistic per-example transform (docs/notes/measure/aug_keying_bench.py)"
timeout 25 python3 docs/notes/measure/aug_keying_bench.py --rounds 15 --images 64 2>&1 | tail -7 || status=1
python3 - "$OUT" <<'PY'
import json, sys
for name in ("aug_torchvision_cuda", "ddp_amp_bf16_cuda", "aug_torchvision_1v2"):
    try:
        r = json.load(open(f"{sys.argv[1]}/{name}.json"))
    except (OSError, ValueError) as e:
        print(f"{name}: no JSON ({e})"); continue
    runs = ", ".join(f"world {x.get('world')} {x.get('run', '')} {x.get('device', '')}".strip() for x in r.get("runs", []))
    print(f"{name}: {r['verdict']} (exit {r['exit_code']}) in {r['seconds']:.1f} s; runs: {runs}")
PY
exit $status
