"""AHA sanity (head re-initialised) and deletion/insertion per refinement setting on bloodmnist-vit.

    python bench/studies/aha_sanity_refine.py DATA_FOLDER SPLIT N SPEC [SPEC ...]   (SPEC: refine_steps=5, mode=per-image)
"""
import sys, json, numpy as np, torch
torch.set_num_threads(1)
from explainers.models import load_model
from explainers.methods import get_method
from explainers.data import open_dataset
from explainers.images import prepare_image
from explainers.metrics import deletion_insertion, spearman
from explainers.sanity import randomization_stages
folder, split, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
b = load_model('bloodmnist-vit')
ds = open_dataset(folder, split=split, limit=n)
imgs = torch.cat([prepare_image(ds.image(i), tuple(b.input_size), b.crop_pct, b.interpolation)[0] for i in range(len(ds))])
with torch.no_grad():
    t = b(imgs).argmax(1)
out = {}
for spec in sys.argv[4:]:
    kw = dict(kv.split('=') for kv in spec.split(',')) if '=' in spec else {}
    kw = {k: (int(v) if v.isdigit() else v) for k, v in kw.items()}
    m = get_method('aha', **kw)
    stages = randomization_stages(b, m, imgs, t, max_layers=1)
    _, _, orig = next(stages); name, _, rnd = next(stages)
    rho = [spearman(orig[i], rnd[i]) for i in range(len(imgs))]
    cur = deletion_insertion(b, imgs, orig, t, steps=16)
    out[spec] = dict(rho_head=float(np.mean(rho)), deletion=float(cur.deletion_auc.mean()), insertion=float(cur.insertion_auc.mean()))
    print(spec, out[spec], flush=True)
print(json.dumps(out, indent=1))
