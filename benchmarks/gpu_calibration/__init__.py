"""GPU calibration cross-check: Llama-3.1-8B-shaped decode/prefill timing (bf16 vs fp8) and board power.

Usage (on the lent GPU, from the repo root):
    PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_calibration
    python3 -m benchmarks.gpu_calibration --dry-run      # tiny 2-layer model on the CPU, no nvidia-smi

Self-contained: torch only (pynvml used for the energy counter if it happens to be importable), no network,
no model download. Random weights in the exact shapes of Llama-3.1-8B (hidden 4096, 32 layers, 32 query
heads, 8 KV heads, head_dim 128, MLP 14336, vocab 128256), fused QKV and gate/up projections as serving
engines use them.

Measures
  1. decode step time of the full stack at batch 1..256, KV context 1024, bf16 and fp8 linears
     (torch._scaled_mm, e4m3 weights with per-tensor scales, static per-tensor activation scales), eager and
     CUDA-graph replay;
  2. prefill time of 512 / 2048 / 8192 tokens in one causal pass, bf16 and fp8;
  3. board power / SM clock / utilization from an `nvidia-smi -lms 100` loop during idle, sustained decode
     (batch 64) and sustained prefill (8192), plus the NVML energy counter where available.
Clocks and power limits are left as found. Timing: CUDA events per iteration, warm-up first, medians.

Writes $OUT/gpu_calibration.json (OUT defaults to ./out) and $OUT/gpu_calibration_smi.csv, prints a table.
Runs on a lent H200 or H100 (the fleet's GPU type); plain PyTorch kernels, not a serving engine, so step times
are a lower bound on an engine's speed: the figures cross-check ratios (fp8/bf16 speed-up, decode batch scaling,
prefill per-token cost) and the power and clock figures (idle, decode, power-limited prefill), not step
coefficients. `benchmarks/gpu_vs_truth.py` sets an H100 run beside the ground truth's H100 physics.

Modules, in the order a run uses them: config (model shape and run sizes), runner (state, log, JSON),
environment (device probe), sampling (nvidia-smi / NVML samplers), model (the stack), build (model, fp8
set-up, correctness checks), ceilings (copy and GEMM rates), timing (events, medians, CUDA graphs), latency
(decode and prefill sweeps), power (sustained phases and their summary), summary (ratios, printed table),
__main__ (command line).
"""
