#!/usr/bin/env bash
# One device call of measurements on a lent GPU, each step under its own deadline inside the call's budget, so that
# one failing or slow step neither ends the call nor costs the next step its time. Run from the project's root on a
# machine staged with ../shared/gpu (stage.sh, then go.sh):
#   bash /root/kit/go.sh bash scripts/gpu_measure.sh bench  [budget_s]  # CUDA tests, bench items 2, 5, 6 (graphs on
#                                                                       # and off), 8 (the sentence-transformers peer),
#                                                                       # then item 2's compiled rows
#   bash /root/kit/go.sh bash scripts/gpu_measure.sh sweeps [budget_s]  # the 20-run ablation (kept), then the same
#                                                                       # with loss=infonce in what time is left
#   bash /root/kit/go.sh bash scripts/gpu_measure.sh head   [budget_s]  # bench item 4 (the frozen epoch) of the card's
#                                                                       # ln_relu and of hidden=[256], 3 turns each,
#                                                                       # interleaved (issue 49's speed target)
# Outputs go to $OUT (the device tool brings back at most 8 files): one .txt per step, session.txt (what ran, exit
# codes, seconds) and, for sweeps, a .tar.gz per sweep of its run folders without weights.
set -uo pipefail
plan=${1:?usage: gpu_measure.sh bench|sweeps [budget_s]}
budget=${2:-420}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
start=$SECONDS
log="$out/session.txt"

left() { echo $((budget - (SECONDS - start))); }

# step NAME LIMIT_S COMMAND...: COMMAND in its own process group, its output in $out/NAME.txt, killed (the whole
# group: a sweep's workers too) at LIMIT_S or when the budget runs out, whichever comes first
step() {
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  if [ "$(left)" -lt 15 ]; then
    echo "$name: skipped, $(left) s of the budget left" | tee -a "$log"
    return
  fi
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  echo "== $name (deadline ${limit} s): $*" | tee -a "$log"
  setsid "$@" >"$out/$name.txt" 2>&1 &
  local pid=$! rc
  while kill -0 "$pid" 2>/dev/null; do
    if [ $((SECONDS - t0)) -ge "$limit" ]; then
      echo "$name: deadline reached, stopping it" | tee -a "$log"
      kill -TERM -- "-$pid" 2>/dev/null
      sleep 5
      kill -KILL -- "-$pid" 2>/dev/null
    fi
    sleep 1
  done
  wait "$pid"
  rc=$?
  echo "$name: exit $rc after $((SECONDS - t0)) s" | tee -a "$log"
  tail -n 4 "$out/$name.txt"
}

# pack NAME FOLDER: the run folders of FOLDER without weights, as $out/NAME.tar.gz
pack() {
  [ -d "$2" ] && tar -czf "$out/$1.tar.gz" --exclude='*.pt' --exclude='*.lock' -C "$(dirname "$2")" "$(basename "$2")"
}

{
  echo "commit ${GPU_COMMIT:-unknown (set GPU_COMMIT)}"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python -c "import torch, transformers, sys; print('torch', torch.__version__, '| transformers', transformers.__version__, '| python', sys.version.split()[0])"
  python -c "import sentence_transformers as s; print('sentence-transformers', s.__version__)" 2>&1 | tail -1
  python -c "import datasets, accelerate; print('datasets', datasets.__version__, '| accelerate', accelerate.__version__)" 2>&1 | tail -1
  nproc
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"

case "$plan" in
bench)
  step pytest_cuda 120 python -m pytest -q -p no:cacheprovider tests/engine/training/test_step_graph.py
  step bench 200 python scripts/bench.py --gpu-only --items train steps finetune
  step bench_eager 80 python scripts/bench.py --gpu-only --items finetune --run-overrides trainer.cuda_graphs=false
  # sentence-transformers' trainer needs datasets and accelerate: wheels carried in .gpu/st (and pyarrow, too large
  # to travel with them, installed into /root/site-st by an earlier call) go on the path of this step alone
  step peer 150 bash -c 'if ! python -c "import datasets, accelerate" 2>/dev/null && [ -d .gpu/st ]; then
      python -m pip install -q --no-index --no-deps --target /root/site-st .gpu/st/*.whl
      export PYTHONPATH=/root/site-st:$PYTHONPATH; fi
    python scripts/bench.py --gpu-only --items peer'
  step compiled 150 python scripts/bench.py --gpu-only --items train --compiled
  ;;
sweeps)
  step sweep_triplet 330 python scripts/bench.py --items sweep --jobs 8 --keep /root/sweeps/triplet
  pack sweep_triplet /root/sweeps/triplet
  step sweep_infonce 330 python scripts/bench.py --items sweep --jobs 8 --keep /root/sweeps/infonce \
    --run-overrides loss=infonce
  pack sweep_infonce /root/sweeps/infonce
  ;;
head)
  for turn in 1 2 3; do
    step "frozen_card_$turn" 90 python scripts/bench.py --items frozen --epochs 5
    step "frozen_h256_$turn" 90 python scripts/bench.py --items frozen --epochs 5 \
      --run-overrides 'model.head.hidden=[256]'
  done
  ;;
*)
  echo "unknown plan $plan: use bench, sweeps or head" >&2
  exit 2
  ;;
esac
echo "gpu_measure $plan: done after $((SECONDS - start)) s of a ${budget} s budget" | tee -a "$log"
