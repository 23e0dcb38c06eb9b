#!/bin/bash
# The default regenerated on a GPU machine's 16 CPU cores (`device: cpu`), for `make compare` against
# reference/default/ made on another CPU, from the project's root once the bundle's env.sh is
# sourced (../shared/device/README.md):
#     benchmarks/device_default.sh OUT [SECONDS]
# OUT gets machine.txt (CPU, cores, torch), snakemake.log, wall.txt and results.tgz (the results folder less
# its caches, model and parquet files: tables, summary, provenance, record, benchmarks, logs).
set -u
out=${1:?usage: $0 OUT [SECONDS]}
mkdir -p "$out"
{ lscpu | grep -E 'Model name|^CPU\(s\)|Flags'; nvidia-smi --query-gpu=name --format=csv,noheader
  python -c 'import torch; print("torch", torch.__version__)'; } > "$out/machine.txt" 2>&1
start=$(date +%s)
timeout "${2:-540}" python -m snakemake --cores all --configfile config.yaml --config device=cpu results=results \
  > "$out/snakemake.log" 2>&1
echo "exit $? after $(( $(date +%s) - start )) s on $(nproc) cores" > "$out/wall.txt"
tar -czf "$out/results.tgz" --exclude='*.parquet' --exclude='*.safetensors' --exclude='*.pt' --exclude=cache \
  --exclude=model results 2>/dev/null
