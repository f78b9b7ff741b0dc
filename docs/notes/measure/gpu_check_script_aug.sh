#!/usr/bin/env bash
# Issue 55 item 5, on a machine with one CUDA GPU (python3 with torch 2.11, from the repository root):
# check-script on one augmentation loop (torchvision v2 RandomCrop + flip in __getitem__, two DataLoader
# workers, the model on CUDA) and one bf16 loop (autocast bf16, AdamW, clipping; the model on CUDA).
#   bash docs/notes/measure/gpu_check_script_aug.sh            # about 1-2 minutes; each check bounded at 75 s
# With one GPU, world 1 runs on the GPU (its runs A and B: the keyed augmentation and the CUDA model must
# reproduce bitwise) and world 2, above the GPU count, runs with the GPUs hidden on the CPU, compared with a
# world 1 on the CPU (docs/guide/check-script.md, "What runs"): 5 runs a check. Expected: both PASSED (exit 0),
# the aug loop's report with the note "random augmentation: ... keyed to the example".
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
  timeout 90 python3 -m mgpu check-script --timeout 75 --json "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $(( ($(date +%s%N) - start) / 1000000 )) ms"
  grep -E "^  (world|note|finding)|^(PASSED|FAILED|NOT VERIFIED)" "$OUT/$name.log" | cut -c1-400
  [ "$rc" = 0 ] || { status=1; tail -20 "$OUT/$name.log"; }
}
check aug_torchvision_cuda examples/loops/aug_torchvision.py --batch-size "{16 // world_size}" --workers 2 --device auto
check ddp_amp_bf16_cuda examples/loops/ddp_amp.py --batch-size "{48 // world_size}" --amp bf16
python3 - "$OUT" <<'PY'
import json, sys
for name in ("aug_torchvision_cuda", "ddp_amp_bf16_cuda"):
    try:
        r = json.load(open(f"{sys.argv[1]}/{name}.json"))
    except (OSError, ValueError) as e:
        print(f"{name}: no JSON ({e})"); continue
    runs = ", ".join(f"world {x.get('world')} {x.get('run', '')} {x.get('device', '')}".strip() for x in r.get("runs", []))
    print(f"{name}: {r['verdict']} (exit {r['exit_code']}) in {r['seconds']:.1f} s; runs: {runs}")
PY
exit $status
