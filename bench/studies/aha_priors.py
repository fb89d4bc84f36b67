"""python bench/studies/aha_priors.py DATA_FOLDER N -- which class-sensitive prior for AHA on bloodmnist-vit: ins-del (val) and head-reinit sanity rho (val)."""
import sys, json, numpy as np, torch
torch.set_num_threads(1)
from explainers.models import load_model
from explainers.methods import get_method
from explainers.metrics import deletion_insertion, spearman
from explainers.data import open_dataset
from explainers.images import prepare_image
from explainers.sanity import randomization_stages

b = load_model('bloodmnist-vit')
ds = open_dataset(sys.argv[1], split='val', limit=int(sys.argv[2]))
imgs = torch.cat([prepare_image(ds.image(i), tuple(b.input_size), b.crop_pct, b.interpolation)[0] for i in range(len(ds))])
with torch.no_grad():
    t = b(imgs).argmax(1)

def z(m):
    f = m.flatten(1); return ((f - f.mean(1, keepdim=True)) / f.std(1, keepdim=True).clamp_min(1e-6)).view_as(m)

class Combo:
    def __init__(self, kind): self.kind = kind
    def maps(self, bundle, x, t):
        r = get_method('rollout').attribute(bundle, x, t)
        if self.kind == 'rollout': return r
        g = get_method('gradcam').attribute(bundle, x, t)
        c = get_method('chefer').attribute(bundle, x, t)
        if self.kind == 'rollout*gradcam': return r * (g + 0.05)
        if self.kind == 'rollout*chefer': return r * (c + 0.05)
        if self.kind == 'z(rollout)+z(gradcam)': return z(r) + z(g)
        if self.kind == 'z(rollout)+2z(gradcam)': return z(r) + 2 * z(g)
        if self.kind == 'chefer': return c
        if self.kind == 'gradcam': return g

from explainers.methods.base import Method
results = {}
for kind in ['rollout', 'chefer', 'gradcam', 'rollout*gradcam', 'rollout*chefer', 'z(rollout)+z(gradcam)', 'z(rollout)+2z(gradcam)']:
    combo = Combo(kind)
    maps = combo.maps(b, imgs, t)
    cur = deletion_insertion(b, imgs, maps, t, steps=16)
    d, ins = float(cur.deletion_auc.mean()), float(cur.insertion_auc.mean())
    # sanity: head re-initialised (first stage of the cascade = the head)
    M = type('M', (Method,), {'name': 'combo_' + kind, 'label': kind, 'families': frozenset({'vit', 'cnn'}),
                              'attribute': lambda self, bundle, x, tt: combo.maps(bundle, x, tt)})
    stages = randomization_stages(b, M(), imgs[:16], t[:16], max_layers=1)
    _, _, orig = next(stages); name, _, rnd = next(stages)
    rho = float(np.mean([spearman(orig[i], rnd[i]) for i in range(16)]))
    results[kind] = dict(deletion=d, insertion=ins, ins_del=ins - d, rho_head=rho, reset=name)
    print(kind, {k: round(v, 4) if isinstance(v, float) else v for k, v in results[kind].items()}, flush=True)
print(json.dumps(results, indent=1))
