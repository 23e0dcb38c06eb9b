#!/bin/bash
# The default's three training branches on a GPU machine, from the project's root once the bundle's
# env.sh is sourced (../shared/device/README.md):
#     benchmarks/gpu_training_branches.sh OUT [GPU_SECONDS] [CPU_SECONDS]
# 1. bench_attention_study.py on cuda: 8 runs one at a time against at once per kind (and at once replayed
#    from a CUDA graph, uph.attention.steps), and 32 at once;
# 2. the attention, copy-task and feedback tables of the default with attention.device cuda: its 18 jobs share
#    the GPU (--resources gpu=18), the copy task and feedback train on the 16 cores beside them;
# 3. the same with NVIDIA MPS started (where nvidia-cuda-mps-control is installed), so the 18 processes'
#    kernels share the GPU's SMs instead of taking turns (projected in docs/performance.md, "Training branches");
# 4. the same on the 16 cores alone (the side-by-side baseline), if time is left.
# OUT gets walls.txt (each run's wall), the benchmark table, and each run's benchmarks, tables and logs.
set -u
out=${1:?usage: $0 OUT [GPU_SECONDS] [CPU_SECONDS]}
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
  python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } > "$out/machine.txt" 2>&1
# the training branches never read the model: a hub id stands in for the package the bundle leaves out
printf 'model:\n  source: HuggingFaceTB/SmolLM2-135M-Instruct\n  gguf_file: null\n' > /tmp/no_model.yaml
bench() { timeout 150 python benchmarks/bench_attention_study.py --config config.yaml /tmp/no_model.yaml --device cuda "$@" 2>&1 | grep -v USDT; }
{ bench --steps 20 --repeats 2; bench --steps 20 --repeats 1 --runs 32 --attentions standard triple_capped; } \
  > "$out/bench_cuda.txt"
printf 'attention:\n  device: cuda\n' > /tmp/attention_cuda.yaml
branches() {  # name, seconds, extra snakemake arguments
  local res=/tmp/res_$1 start=$(date +%s%N)
  timeout "$2" python -m snakemake --cores 16 --resources gpu=18 "${@:3}" --config results=$res -- \
    $res/tables/attention.csv $res/tables/copy_task.csv $res/tables/feedback.csv > "$out/snakemake_$1.log" 2>&1
  echo "$1: exit $? after $(( ($(date +%s%N) - start) / 1000000 )) ms" >> "$out/walls.txt"
  tar -czf "$out/results_$1.tgz" -C $res benchmarks tables logs 2>/dev/null
}
branches gpu "${2:-240}" --configfile config.yaml /tmp/no_model.yaml /tmp/attention_cuda.yaml
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY && nvidia-cuda-mps-control -d
  branches gpu_mps "${2:-240}" --configfile config.yaml /tmp/no_model.yaml /tmp/attention_cuda.yaml
  echo quit | nvidia-cuda-mps-control
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
else
  echo "gpu_mps: skipped, no nvidia-cuda-mps-control" >> "$out/walls.txt"
fi
branches cpu16 "${3:-200}" --configfile config.yaml /tmp/no_model.yaml
