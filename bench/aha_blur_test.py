"""AHA T=0 with and without an output blur, and Grad-CAM, on test images (never trained or selected on), with
paired bootstrap 95% intervals (issue #16). The blur is chosen on held-out images first (`python -m explainers
aha-output-blur`); this only reports it on the test split.

    python bench/aha_blur_test.py . weights/aha-efficientnet-lite0 16 bench/results/aha-blur16-effnet-test200.json \
        efficientnet-lite0 ../shared/data/imagenet-samples 200
    (arguments: repository root, explainer stem, sigma in pixels, output file, model, test data, images)
"""
import json, sys, time
import numpy as np, torch
sys.path.insert(0, sys.argv[1])
from explainers.models import load_model
from explainers.aha.store import load_explainer
from explainers.aha.output_blur import measure_output_blur
from explainers.aha.train import load_eval_images
from explainers.metrics import deletion_insertion
from explainers.methods import get_method
from explainers.statistics import bootstrap_ci, paired_difference
torch.set_num_threads(1)
stem, sigma, out = sys.argv[2], float(sys.argv[3]), sys.argv[4]
bundle = load_model(sys.argv[5])
ex = load_explainer(bundle, stem).eval()
images, _ = load_eval_images(bundle, sys.argv[6], int(sys.argv[7]), split='test')
t0 = time.time()
scores = measure_output_blur(ex, images, [0.0, sigma], batch_size=8, progress=True)
gc = {'deletion': [], 'insertion': []}
for s in range(0, len(images), 8):
    x = images[s:s + 8]
    with torch.no_grad():
        t = bundle(x).argmax(1)
    m = get_method('gradcam').attribute(bundle, x, t).detach()
    c = deletion_insertion(bundle, x, m, t)
    gc['deletion'] += list(c.deletion_auc); gc['insertion'] += list(c.insertion_auc)
gc = {k: np.array(v) for k, v in gc.items()}
rows = {'aha no blur': scores[0.0], f'aha blur {sigma:g}': scores[sigma], 'gradcam': gc}
res = {'data': f'{sys.argv[6]} ({len(images)} images spread over the file)', 'model': sys.argv[5], 'explainer': stem, 'sigma': sigma,
       'seconds': round(time.time() - t0, 1), 'methods': {}, 'paired': {}}
for k, r in rows.items():
    idl = r['insertion'] - r['deletion']
    res['methods'][k] = {'deletion': float(r['deletion'].mean()), 'deletion_ci': bootstrap_ci(r['deletion']),
                         'insertion': float(r['insertion'].mean()), 'insertion_ci': bootstrap_ci(r['insertion']),
                         'ins_del': float(idl.mean()), 'ins_del_ci': bootstrap_ci(idl),
                         'per_image': {'deletion': r['deletion'].round(6).tolist(), 'insertion': r['insertion'].round(6).tolist()}}
for a, b in [(f'aha blur {sigma:g}', 'gradcam'), (f'aha blur {sigma:g}', 'aha no blur'), ('aha no blur', 'gradcam')]:
    A, B = rows[a], rows[b]
    res['paired'][f'{a} - {b}'] = {m: paired_difference(A[m], B[m]) for m in ('deletion', 'insertion')}
    res['paired'][f'{a} - {b}']['ins_del'] = paired_difference(A['insertion'] - A['deletion'], B['insertion'] - B['deletion'])
json.dump(res, open(out, 'w'), indent=1, default=float)
for k, v in res['methods'].items():
    print(k, round(v['deletion'], 4), round(v['insertion'], 4), round(v['ins_del'], 4))
for k, v in res['paired'].items():
    print(k, {m: (round(d['mean'], 4), [round(c, 4) for c in d['ci95']]) for m, d in v.items()})
