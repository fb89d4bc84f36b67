"""Issue #15, the one lever not tried before 2026-12-04: how much torch.compile (inductor, CPU) takes off GradSkip's
map from a kept state (a new alpha), batch 1, one thread. A measurement, not used by the method.

    python bench/studies/gradskip_compiled_map.py
"""
import os
import time
from explainers.images import load_image, prepare_for_model
from explainers.methods.gradskip import prepare
from explainers.models import load_model

import torch

REPEATS = 200
CELL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "bloodmnist",
                    "test_00000.jpg")


def per_call_ms(function) -> float:
    for _ in range(20):
        function()
    started = time.perf_counter()
    for _ in range(REPEATS):
        function()
    return (time.perf_counter() - started) / REPEATS * 1000


torch.set_num_threads(1)
bundle = load_model("bloodmnist-vit")
image, _ = prepare_for_model(load_image(CELL), bundle)
state = prepare(bundle, image, torch.tensor([0]))


def new_alpha():
    return state.map(alpha=0.5)


print(f"eager map ms {per_call_ms(new_alpha):.3f}")
compiled = torch.compile(new_alpha, dynamic=False)
started = time.perf_counter()
out = compiled()
print(f"compile s {time.perf_counter() - started:.1f}")
print("same map:", bool(torch.allclose(out, new_alpha(), atol=1e-6)))
print(f"compiled map ms {per_call_ms(compiled):.3f}")
