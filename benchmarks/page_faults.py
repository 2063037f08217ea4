"""What glibc's malloc costs a CPU training step when it gives back what each step frees, and what
``keep_freed_memory()`` saves: ResNet18 (weights=None) on random 3x32x32 images, batches of 16,
``--steps`` steps (default 90: three epochs of 30), one thread, ``Doctor()`` at its defaults, in fresh
processes (the allocator's state is the process's), alternately as the process starts and with
``keep_freed_memory()`` called first. Each prints the mean step the Doctor timed, the page faults and
kernel time of the median step (the ``page_faults`` finding's evidence, when it came) and the kinds found.

    python benchmarks/page_faults.py [--rounds 3] [--steps 90]
"""

from __future__ import annotations

import json
import subprocess
import sys

from common import benchmark_args, median

RUN = """
import json, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import resnet18
import hookscope as hs
from hookscope.doctor.timing import keep_freed_memory

if sys.argv[1] == "keep":
    keep_freed_memory()
torch.set_num_threads(1)
torch.manual_seed(0)
steps = int(sys.argv[2])
x, y = torch.randn(16 * steps // 3, 3, 32, 32), torch.randint(0, 10, (16 * steps // 3,))
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
doctor = hs.callbacks.Doctor(quiet=True)
model = resnet18(weights=None, num_classes=10)
hs.Learner(model, (loader, None), nn.CrossEntropyLoss(), cbs=[doctor], progress=False).fit(3)
breakdown = doctor.timing.breakdown
step = sum(breakdown[k] for k in ("data", "forward", "backward", "optimizer", "other"))
found = {f.kind: f.evidence for f in doctor.findings}
print(json.dumps({"step_ms": step * 1e3, "found": found}))
"""


def run(mode: str, steps: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", RUN, mode, str(steps)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0], {}, {"--steps": (90, "training steps per run")})
    rounds, steps = (1, 30) if args.quick else (args.rounds, args.steps)
    results: dict[str, list[dict]] = {"as the process starts": [], "keep_freed_memory()": []}
    for _ in range(rounds):
        results["as the process starts"].append(run("as is", steps))
        results["keep_freed_memory()"].append(run("keep", steps))
    print(f"ResNet18, batch 16 of 3x32x32, {steps} steps, 1 thread, Doctor(), {rounds} fresh processes each")
    for name, runs in results.items():
        faults = [r["found"]["page_faults"] for r in runs if "page_faults" in r["found"]]
        line = f"  {name:<24} {median([r['step_ms'] for r in runs]):7.1f} ms/step (median of the runs' means)"
        line += f"; page_faults in {len(faults)} of {len(runs)}"
        if faults:
            per_step, kernel = (median([f[key] for f in faults]) for key in ("faults_per_step", "kernel_ms"))
            line += f": {per_step:,.0f} faults, {kernel:.1f} ms in the kernel a step"
        print(line)


if __name__ == "__main__":
    main()
