#!/usr/bin/env bash
# Issue 53 item 4 on a lent GPU (docs/notes/gpu-runs.md, 2026-11-28): the counted baseline on CUDA (kernel
# launches and peak memory) and validate-gate with a plant that CUDA-graph replays run.
#   OUT=/tmp/gpu bash docs/notes/measure/gpu_counts_and_graph_plant.sh
#   OUT=/tmp/gpu VG_RUNS=2 SKIP_SAME_CHECK=1 bash ...   # the second call: fewer gate runs, no same-tree counts check
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:-perf-results/gpu}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
PLUGINS_OFF="-p no:cacheprovider -p no:hypothesispytest -p no:hydra_pytest -p no:anyio"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
summary() {  # each entry of a counts file: its test, CUDA kernels a step and the step's peak
  python3 - "$1" <<'PY'
import json, sys
for e in json.load(open(sys.argv[1]))["entries"]:
    for c in e["counts"]:
        cuda = c.get("cuda") or {}
        print(f"  {e['test']}: {sum(c.get('ops', {}).values())} ops, host reads {c.get('host_reads')}, "
              f"CUDA kernels {cuda.get('kernels')}, peak {(cuda.get('peak_bytes') or 0) / 2**20:.1f} MiB")
PY
}
echo "== 1. the GPU plant runs in a CUDA-graph replay (mgpu_perf_tests/test_lab.py)"
timeout 120 python3 -m pytest mgpu_perf_tests/test_lab.py mgpu_perf_tests/test_round_health.py $PLUGINS_OFF -q -rs --tb=short 2>&1 | tail -25
echo "== 2. pytest perf --counts-save on CUDA"
start=$(date +%s)
timeout 150 python3 -m pytest perf --counts-save "$OUT/counts-cuda.json" $PLUGINS_OFF -q -rs 2>&1 | tail -6
echo "   ($(( $(date +%s) - start )) s)"; summary "$OUT/counts-cuda.json"
if [ "${SKIP_SAME_CHECK:-0}" != 1 ]; then
echo "== 3. pytest perf --counts-check of the same tree (expect: every entry the same, exit 0)"
start=$(date +%s)
timeout 120 python3 -m pytest perf --counts-check "$OUT/counts-cuda.json" $PLUGINS_OFF -q -rs 2>&1 | tail -12
echo "   exit ${PIPESTATUS[0]} ($(( $(date +%s) - start )) s)"
fi
echo "== 3b. --counts-check from a copy with the GPU plant (expect: CUDA kernels grow, exit 1)"
python3 -c "from pathlib import Path; from mgpu_perf.lab.plants import copy_tree; copy_tree(Path('.'), Path('/tmp/planted'), gpu=0.1)"
(cd /tmp/planted && PYTHONPATH=/tmp/planted timeout 120 python3 -m pytest perf --counts-check "$OUT/counts-cuda.json" \
   $PLUGINS_OFF -q -rs 2>&1 | grep -v "^\s*$" | tail -14; echo "   exit ${PIPESTATUS[0]}")
VG_RUNS=${VG_RUNS:-3}
echo "== 4. validate-gate --plant-on gpu ($VG_RUNS runs a kind, single step only)"
start=$(date +%s)
timeout 270 python3 -m mgpu_perf validate-gate --runs "$VG_RUNS" --set-runs 0 --without-half --plant-on gpu \
  --stop-starting-after-min 2.5 --out "$OUT" 2>&1 | tail -45
echo "   exit ${PIPESTATUS[0]} ($(( $(date +%s) - start )) s)"
ls "$OUT"
