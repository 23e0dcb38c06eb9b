#!/bin/bash
# The language-model fit stage on a GPU machine, from the project's root once the
# bundle's env.sh is sourced (../shared/device/README.md); about 10 minutes:
#     benchmarks/gpu_fit_stage.sh OUT [DEFAULT_SECONDS]
# 1. the engine's CUDA tests (the stacked round and the halves' alternation, the engine against its CPU path);
# 2. bench_lockstep.py on cuda: the operations a round dispatches for 1 and 12 users at the default's V and
#    train tokens, then 12 default-sized users' paths one at a time, in lockstep, and stacked in two halves;
#    and bench_attention_study.py on cuda: 8 runs of standard and triple_capped attention one at a time, at once
#    and at once replayed from a CUDA graph (uph.attention.steps; its bit-for-bit test is in tests/test_gpu.py);
#    bench_startup.py: each GPU stage's start-up (warm imports, then the CUDA set-up piece by piece), on cuda;
# 3. the default with `device: cuda` in a fresh folder (its makespan, and each
#    rule's job-seconds from its benchmarks), then
#    uph.compare against reference/default (the CPU's).
# OUT gets machine.txt, tests.txt, lockstep.txt, attention.txt, startup.txt, default.log, wall.txt, compare.txt and the default's
# benchmarks, tables, provenance and logs (default.tgz).
set -u
out=${1:?usage: $0 OUT [DEFAULT_SECONDS]}
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
  python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } > "$out/machine.txt" 2>&1
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_round.py tests/test_gpu.py > "$out/tests.txt" 2>&1
{ timeout 90 python benchmarks/bench_lockstep.py --device cuda --ops --tokens 1640
  timeout 150 python benchmarks/bench_lockstep.py --device cuda --users 12 --tokens 1640; } 2>&1 | grep -v USDT \
  > "$out/lockstep.txt"
timeout 60 python benchmarks/bench_attention_study.py --device cuda --steps 20 \
  --repeats 1 --attentions standard triple_capped 2>&1 | grep -v USDT > "$out/attention.txt"
timeout 90 python benchmarks/bench_startup.py --runs 3 --scripts extract fit_global fit_validate fit fit_others \
  fit_cross_user 2>&1 | grep -v USDT > "$out/startup.txt"
res=/tmp/res_cuda start=$(date +%s)
timeout "${2:-300}" python -m snakemake --cores all --configfile config.yaml --config device=cuda results=$res \
  > "$out/default.log" 2>&1
echo "exit $? after $(( $(date +%s) - start )) s on $(nproc) cores" > "$out/wall.txt"
timeout 60 python -m uph.compare $res > "$out/compare.txt" 2>&1
echo "compare exit $?" >> "$out/compare.txt"
tar -czf "$out/default.tgz" -C $res benchmarks tables logs provenance.json summary.md 2>/dev/null
