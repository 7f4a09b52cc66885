#!/usr/bin/env bash
# Prepare, on the CPU machine and from the project's root, what sentence-transformers' own trainer needs on the GPU
# image beyond what it has (bench item 8, scripts/gpu_measure.sh's peer step): two ignored carry folders of Python
# 3.12 wheels for the device tool.
#   .gpu/pyarrow  pyarrow alone (about 55 MB: it travels in a call of its own, beside the working tree)
#   .gpu/st       datasets, accelerate and their small dependencies (about 5 MB: with .gpu/p2)
# Installed into /root/site-st on the GPU machine and put on the path of the peer step alone, so nothing else there
# runs with them.
set -euo pipefail
[ -f pyproject.toml ] && [ -d src/biencoder ] || { echo "run this from the project's root"; exit 2; }
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
rm -rf .gpu/pyarrow .gpu/st && mkdir -p .gpu/pyarrow .gpu/st
platform=(--only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux_2_28_x86_64)
python3 -m pip download -q --no-deps "${platform[@]}" -d .gpu/pyarrow pyarrow
python3 -m pip download -q --no-deps "${platform[@]}" -d .gpu/st datasets accelerate dill multiprocess xxhash \
  aiohttp multidict yarl frozenlist aiosignal propcache aiohappyeyeballs attrs fsspec
du -sh .gpu/pyarrow .gpu/st
echo "device calls, after stage.sh: carry [\".gpu/pyarrow\"]: python3 -c 'import pyarrow' 2>/dev/null ||"
echo "  python3 -m pip install -q --no-index --no-deps --target /root/site-st .gpu/pyarrow/*.whl"
echo "then carry [\".gpu/p2\", \".gpu/st\"]: GPU_COMMIT=<sha> bash /root/kit/go.sh bash scripts/gpu_measure.sh bench"
