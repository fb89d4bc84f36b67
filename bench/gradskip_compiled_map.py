"""Issue #15, the one lever not tried before session 22: how much torch.compile (inductor, CPU) takes off GradSkip's
map from a kept state (a new alpha), batch 1, one thread. A measurement, not used by the method.

    python bench/gradskip_compiled_map.py
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(1)
from explainers.models import load_model
from explainers.methods.gradskip import prepare
from explainers.images import load_image, prepare_for_model
b = load_model('bloodmnist-vit')
x, _ = prepare_for_model(load_image('assets/bloodmnist/test_00000.jpg'), b)
state = prepare(b, x, torch.tensor([0]))
def f(): return state.map(alpha=0.5)
for _ in range(20): f()
t=time.perf_counter()
for _ in range(200): f()
eager=(time.perf_counter()-t)/200*1000
print('eager map ms', round(eager,3))
cf = torch.compile(f, dynamic=False)
t=time.perf_counter(); out=cf(); print('compile s', round(time.perf_counter()-t,1))
print('same', torch.allclose(out, f(), atol=1e-6))
for _ in range(20): cf()
t=time.perf_counter()
for _ in range(200): cf()
print('compiled map ms', round((time.perf_counter()-t)/200*1000,3))
