#!/usr/bin/env bash
# The checks that need a GPU, in one run, for a session that is lent one: the tests marked `cuda` (among
# them the host-sync check of the Learner and the Doctor), the demo trained on the GPU in float32 and
# float16, and the Doctor's cost there (doctor_overhead.py --cuda; doctor_gpu_steps.py: by kind of
# step). About 4 minutes on an H200, the machine's start not counted. Each part runs whatever the others
# do; the exit status is non-zero when the tests or a demo failed. Logs go to $OUT (else /tmp/hookscope-gpu).
#
#   bash benchmarks/on_gpu.sh            # from the repository root, with python3 holding a CUDA torch
#   PYTHON=.venv/bin/python bash benchmarks/on_gpu.sh
set -u
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
out=${OUT:-/tmp/hookscope-gpu}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0

nvidia-smi -L
"$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, torch.cuda.get_device_name())'

echo "== pytest -m cuda"
"$py" -m pytest -m cuda -p no:cacheprovider -q $(grep -rl "mark.cuda" tests) 2>&1 | tee "$out/cuda_tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

for precision in 32 fp16; do
    echo "== hookscope train --device cuda --precision $precision"
    "$py" -m hookscope train --out "/tmp/hookscope-gpu-demo-$precision" --overwrite --device cuda \
        --precision "$precision" 2>&1 | tee "$out/demo_$precision.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done

echo "== doctor_overhead.py --cuda"
"$py" benchmarks/doctor_overhead.py --cuda --rounds "${ROUNDS:-7}" --resnet-batch 64 2>&1 |
    tee "$out/doctor_overhead_cuda.log"

echo "== doctor_gpu_steps.py"
"$py" benchmarks/doctor_gpu_steps.py 2>&1 | tee "$out/doctor_gpu_steps.log"
exit $status
