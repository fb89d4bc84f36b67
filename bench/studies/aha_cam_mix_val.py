"""AHA's map mixed with the class activation map of the same pass (issue #16), on held-out images only.

Variants of the shipped one-pass map: standardised (`aha_z`), gated by the positive CAM (`gateP`: times
(relu CAM / max) ** P), plus lambda x the standardised CAM (`addL`), times sigmoid(k x CAM) (`sigK`); CAM and
Grad-CAM alone. Hard deletion / insertion (K=20, mean reference, top-1 targets) with paired intervals to the
shipped map, and (BloodMNIST) GridPG share and top quarter on val mosaics (seed 0).

    python bench/studies/aha_cam_mix_val.py bloodmnist-cnn 256 48 ../shared/data/bloodmnist/64 OUT.json
    python bench/studies/aha_cam_mix_val.py efficientnet-lite0 40 0 card OUT.json   (the photos its card held out)
"""
import sys, json, time
import numpy as np, torch
torch.set_num_threads(1)
from explainers.models import load_model
from explainers.aha.store import load_explainer, explainer_stem
from explainers.aha_training.data import load_eval_images
from explainers.metrics import deletion_insertion
from explainers.statistics import bootstrap_ci, paired_difference
from explainers import gridpg as G
from explainers.data import open_dataset
from explainers.evaluate import build_methods

model = sys.argv[1] if len(sys.argv) > 1 else "bloodmnist-cnn"
n_cells = int(sys.argv[2]) if len(sys.argv) > 2 else 256
n_mos = int(sys.argv[3]) if len(sys.argv) > 3 else 48
data = sys.argv[4] if len(sys.argv) > 4 else "../shared/data/bloodmnist/64"
out_file = sys.argv[5]
bundle = load_model(model)
ex = load_explainer(bundle, explainer_stem(model)).eval()
gradcam = build_methods(bundle, ["gradcam"])[0][1]

def z(m):
    f = m.flatten(1); return (m - f.mean(1).view(-1,1,1)) / f.std(1).clamp_min(1e-6).view(-1,1,1)

def variants(x, targets):
    with torch.no_grad():
        enc = ex.encode(x)
        fused, cam = ex.trunk(enc, targets)
        m = ex.head_output(fused, cam, enc.image_hw)  # shipped map (blur incl.)
    zc = cam  # standardised CAM at input size
    zm = z(m)
    g = zc.clamp_min(0); g = g / g.flatten(1).amax(1).clamp_min(1e-6).view(-1,1,1)
    out = {"aha": m, "aha_z": zm, "cam": zc}
    for p in (0.5, 1.0, 2.0):
        out[f"gate{p:g}"] = (zm - zm.flatten(1).amin(1).view(-1,1,1)) * g**p
    for lam in (0.25, 0.5, 1.0):
        out[f"add{lam:g}"] = z(zm + lam * zc)
    # soft gate: multiply by sigmoid of cam
    for k in (1.0, 2.0):
        out[f"sig{k:g}"] = (zm - zm.flatten(1).amin(1).view(-1,1,1)) * torch.sigmoid(k * zc)
    out["gradcam"] = gradcam.attribute(bundle, x, targets).detach()
    return out

t0 = time.time()
BS = 32 if n_mos else 8
if data == "card":
    rec = ex.card["recipe"]; data = rec["data"]
    images, _ = load_eval_images(bundle, data, n_cells, split="val", indices=[int(i) for i in rec["held_out_indices"]])
else:
    images, _ = load_eval_images(bundle, data, n_cells, split="val")
rows = {}
for s in range(0, len(images), BS):
    x = images[s:s+BS]
    with torch.no_grad():
        targets = bundle(x).argmax(1)
    for k, m in variants(x, targets).items():
        c = deletion_insertion(bundle, x, m.float(), targets, steps=20, reference="mean")
        r = rows.setdefault(k, {"d": [], "i": []})
        r["d"].append(np.asarray(c.deletion_auc)); r["i"].append(np.asarray(c.insertion_auc))
print("cells done", time.time()-t0, flush=True)
res = {"cells": {}}
base = None
for k, r in rows.items():
    d = np.concatenate(r["d"]); i = np.concatenate(r["i"]); idl = i - d
    if k == "aha": base = (d, i, idl)
for k, r in rows.items():
    d = np.concatenate(r["d"]); i = np.concatenate(r["i"]); idl = i - d
    res["cells"][k] = dict(deletion=float(d.mean()), insertion=float(i.mean()), ins_del=float(idl.mean()),
                          ci=bootstrap_ci(idl), vs_aha=paired_difference(idl, base[2]),
                          del_vs_aha=paired_difference(d, base[0])["mean"], ins_vs_aha=paired_difference(i, base[1])["mean"])
    print(f"{k:10s} del {d.mean():.4f} ins {i.mean():.4f} ins-del {idl.mean():.4f} vs aha {res['cells'][k]['vs_aha']['mean']:+.4f} {res['cells'][k]['vs_aha']['ci95']}", flush=True)

if n_mos == 0:
    json.dump(res, open(out_file, "w"), indent=1, default=float); sys.exit()
ds = open_dataset(data, split="val")
plan = G.plan_mosaics(ds.labels, n_mos, 0)
mb, cell = G.mosaic_model(bundle)
share = {}; tq = {}
for s in range(0, len(plan), 8):
    chunk = plan[s:s+8]
    mos, classes = G.build_mosaics(ds, chunk, cell, bundle)
    imgs = mos.repeat_interleave(4, 0); t = classes.reshape(-1)
    q = torch.arange(4).repeat(len(chunk))
    for k, m in variants(imgs, t).items():
        share.setdefault(k, []).extend(G.quadrant_share(m, q).tolist())
        tq.setdefault(k, []).extend(G.top_quarter_share(m, q).tolist())
res["gridpg"] = {k: dict(share=float(np.mean(share[k])), top_quarter=float(np.mean(tq[k]))) for k in share}
for k in share:
    print(f"gridpg {k:10s} share {np.mean(share[k]):.3f} top quarter {np.mean(tq[k]):.3f}")
json.dump(res, open(out_file, "w"), indent=1, default=float)
print("total", time.time()-t0)
