# `make train` and `make test` set themselves up: a .venv with mgpu and its test extras.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: train test test-part-correctness test-part-tools test-part-harness test-part-rounding test-serial test-slow test-correctness test-kernels stress convergence perf counts-check gpu-check clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

# The main job, sized for a 2-core CPU (about 1 minute): ResNet-18 at width 16 on synthetic data.
train: $(VENV)/.installed
	$(PY) -m mgpu train --model resnet18 --width 16 --epochs 2 --batch-size 128 --lr 0.1 \
		--train-size 8192 --test-size 2000 --out runs/quick

# Other CPUs round differently: these switch this CPU's kernels to paths another CPU would take
# (PyTorch's ATen kernels by ATEN_CPU_CAPABILITY, oneDNN's by ONEDNN_MAX_CPU_ISA; docs/guide/kernels.md).
ROUNDING_PATH := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41
KERNEL_PATHS ?= default:SSE41 avx2:AVX2 $(if $(shell grep -m1 -o avx512f /proc/cpuinfo 2>/dev/null),avx512:AVX512_CORE)

# Everything CI runs: the correctness suite, every benchmark once as a smoke test, the harness's and
# the A/B gate's own tests (mgpu_perf_tests/), the examples, and the
# comparisons that rounding could break (marker `rounding`) again under the generic kernels, so that
# a test tuned to this CPU's rounding goes red here before it reaches another machine.
# In two phases: first everything that times nothing, in four parts, three at a time (TEST_JOBS): the
# correctness suite with the perf smoke run (its benchmarks run once untimed under --benchmark-disable);
# check-script's and the examples' tests; the harness's and gate's tests that time nothing (mgpu_perf_tests
# without marker `timed`: synthetic samples, counts, reports, bad input, plumbing); the rounding pass. Then,
# alone, the tests marked `timed` (a gate's verdict or a ratio over real timings), which load beside them
# would make skip or say inconclusive. The parts wait on processes they start as much as they compute, so
# three at once finished first (the figures: docs/notes/suite-times.md, 2026-11-28). Each part's output
# comes when it ends.
# Phase 1's parts share two cores among more busy threads than cores: OMP_WAIT_POLICY=PASSIVE has a thread
# that waits for work sleep instead of spinning on a core another part needs (it computes the same numbers).
TEST_OPTS := --benchmark-disable -q -p no:cacheprovider
TEST_ARGS := $(TEST_OPTS) -m "not slow"
TEST_JOBS ?= 3
PHASE1_ENV ?= OMP_WAIT_POLICY=PASSIVE
test: $(VENV)/.installed
	@$(PHASE1_ENV) $(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target test-part-correctness test-part-tools test-part-harness test-part-rounding
	$(PY) -m pytest mgpu_perf_tests $(TEST_OPTS) -m "timed and not slow"

test-part-correctness: $(VENV)/.installed
	$(PY) -m pytest correctness perf $(TEST_ARGS)

# Fourth in line: it starts when the first of the three parts before it ends (TEST_JOBS at a time), so that
# no core idles while the longest part finishes.
test-part-rounding: $(VENV)/.installed
	$(ROUNDING_PATH) $(PY) -m pytest correctness -m "rounding and not slow" -q -p no:cacheprovider

test-part-tools: $(VENV)/.installed
	$(PY) -m pytest scriptcheck_tests examples $(TEST_ARGS)

test-part-harness: $(VENV)/.installed
	$(PY) -m pytest mgpu_perf_tests $(TEST_OPTS) -m "not slow and not timed"

# The same tests one after another, as `make test` ran them until 2026-11-28 (for comparing the two).
test-serial: $(VENV)/.installed
	$(PY) -m pytest correctness scriptcheck_tests perf mgpu_perf_tests examples --benchmark-disable -q -m "not slow"
	$(ROUNDING_PATH) $(PY) -m pytest correctness -m "rounding and not slow" -q -p no:cacheprovider

# What `make test` leaves out to stay within CI's time (marker `slow`): check-script at 1 vs 3 ranks, HF Trainer's
# loops, some example models and loops, the GPU workflow's rehearsal (mgpu_perf_tests/test_workflow.py), perf --model timed,
# the `mgpu gate` command's A/A run and run budget end to end, and `calibrate` (the plugin's slower-commit run stays in make test).
test-slow: $(VENV)/.installed
	$(PY) -m pytest correctness scriptcheck_tests perf mgpu_perf_tests examples --benchmark-disable -q -m slow

# The whole correctness suite under every kernel path this CPU has (a few minutes each).
test-kernels: $(VENV)/.installed
	@for path in $(KERNEL_PATHS); do \
		echo "== ATEN_CPU_CAPABILITY=$${path%%:*} ONEDNN_MAX_CPU_ISA=$${path##*:}"; \
		ATEN_CPU_CAPABILITY=$${path%%:*} ONEDNN_MAX_CPU_ISA=$${path##*:} $(PY) -m pytest correctness -q -p no:cacheprovider || exit 1; \
	done

# The suite's multi-process tests (DDP, FSDP, torchrun nodes, checkpoints, bad input) run STRESS_RUNS times in the
# suite's order as a CI runner's background job would meet them: SIGINT ignored, a CPU burner on every core, a disk
# writer beside; counts green, red and hung runs (correctness/stress.py; figures in docs/notes/suite-times.md).
# STRESS_TESTS takes any pytest selection; STRESS_ENV e.g. ATEN_CPU_CAPABILITY=default for the kill-and-resume test.
STRESS_RUNS ?= 10
STRESS_TESTS ?= -m "reliability or multiprocess" correctness
STRESS_ENV ?=
stress: $(VENV)/.installed
	$(STRESS_ENV) $(PY) -m correctness.stress --runs $(STRESS_RUNS) -- $(STRESS_TESTS)

test-correctness: $(VENV)/.installed
	$(PY) -m pytest correctness -q

# The chapter's 2-GPU experiment in small (docs/notes/convergence.md): 1 device at 256 / 0.1 against 2 DDP ranks
# at 512 / 0.2, 8 epochs each, seeds 0 to 2; the per-epoch accuracies are in runs/convergence/*/results.json.
CONVERGENCE_RUN := --model resnet18 --width 4 --resize 14 --epochs 8 --train-size 8192 --test-size 500 --no-progress
convergence: $(VENV)/.installed
	@for seed in 0 1 2; do \
		$(PY) -m mgpu train --strategy single $(CONVERGENCE_RUN) --batch-size 256 --lr 0.1 --seed $$seed \
			--out runs/convergence/single-seed$$seed | tail -1; \
		$(PY) -m mgpu train --strategy ddp --devices 2 $(CONVERGENCE_RUN) --batch-size 512 --lr 0.2 --seed $$seed \
			--out runs/convergence/ddp-seed$$seed | tail -1; \
	done

# The counted baseline (docs/guide/gate.md, "A counted baseline in the repository"): the step of each
# gated benchmark counted and compared exactly with perf/counts-cpu.json; no timing. Its own target, not
# in `make test`: about 20 s of CPU, ranks included; on this shared 2-core VM 62 s wall at load 9 (32 s
# at best), the ddp and fsdp ranks counted beside pytest's own steps (docs/notes/counted-baseline.md).
# Exit 1: a guarded count grew or fell (the log prints the update command); 6: recorded under another torch.
COUNTS_FILE ?= perf/counts-cpu.json
# hypothesis's, hydra's and anyio's pytest plugins are left out: the perf suite uses none of them, and
# importing hypothesis alone costs a CPU-second or two at every start.
COUNTS_PLUGINS_OFF := -p no:cacheprovider -p no:hypothesispytest -p no:hydra_pytest -p no:anyio
counts-check: $(VENV)/.installed
	$(PY) -m pytest perf --devices 2 --counts-check $(COUNTS_FILE) $(COUNTS_PLUGINS_OFF) -q -rs

# Real timings (a few minutes), with a scaling table at the end.
perf: $(VENV)/.installed
	$(PY) -m pytest perf

# GPU acceptance (docs/guide/gpu.md), on a machine with >= 1 CUDA device and torch, pytest, pytest-benchmark,
# hypothesis (and scipy, for the A/B gate's tests) already installed: no .venv, no install.
GPU_PY ?= python3
GPU_OUT ?= perf-results/gpu
gpu-check:
	PYTHONPATH=. $(GPU_PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make gpu-check: no CUDA device visible to torch')"
	PYTHONPATH=. $(GPU_PY) -m pytest correctness -m gpu -p no:cacheprovider -q -rs
	PYTHONPATH=. $(GPU_PY) -m pytest correctness/test_sync_budget.py -p no:cacheprovider -q -rs
	mkdir -p $(GPU_OUT)  # --benchmark-json does not create its folder
	PYTHONPATH=. $(GPU_PY) -m pytest perf -p no:cacheprovider -q --perf-out $(GPU_OUT) --benchmark-json $(GPU_OUT)/benchmark.json
	PYTHONPATH=. $(GPU_PY) -m pytest mgpu_perf_tests -m "not slow" -p no:cacheprovider -q -rs
	PYTHONPATH=. $(GPU_PY) -m mgpu train --model resnet18 --width 64 --epochs 1 --batch-size 256 --lr 0.1 \
		--data-on-device --amp bf16 --channels-last --no-progress --out runs/gpu-check
	OUT=$(GPU_OUT)/check-script bash docs/notes/measure/gpu_check_script_aug.sh  # augmentation and bf16 loops on CUDA

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis .benchmarks perf-results
