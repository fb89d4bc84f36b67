"""bloodmnist-vit: a class signal for one-pass AHA without a backward pass (issue #16, the sanity target).

Direct logit attribution (DLA): patch j's share of the class logit through the class token's attention,
sum_h a_h(cls, j) <W_o v_h(j), g>, g = d logit / d (final class token before the last LayerNorm), from the last
block or summed over all blocks (a linear read of the residual stream, ours). Measured on val cells: hard
deletion / insertion of DLA alone and of AHA's map mixed with it (added, gated, sigmoid-weighted), and each map's
Spearman rho with the map after the classifier's head is re-initialised (the sanity check; lower = more
class-dependent).

    python bench/studies/aha_vit_logit_attribution_val.py 64 ../shared/data/bloodmnist/64 OUT.json
"""
import sys, json, copy
import numpy as np, torch

from explainers.models import load_model
from explainers.aha.store import load_explainer, explainer_stem
from explainers.aha_training.data import load_eval_images
from explainers.metrics import deletion_insertion, spearman
from explainers.statistics import paired_difference
from explainers.sanity import reinitialise
import torch.nn.functional as F

def dla_record(bundle, x):
    """One pass of the classifier (attention unfused, under the model's lock) keeping, for every block, qkv and the
    attention, and the final class token before the last LayerNorm: what `dla_read` needs for any head row."""
    from explainers.attention import disable_fused_attention, model_lock, restore_fused_attention

    net = bundle.network
    store = {}
    blocks = list(net.blocks)
    with model_lock(bundle):
        hooks = []
        for l, block in enumerate(blocks):
            hooks.append(block.attn.qkv.register_forward_hook(lambda m, i, o, l=l: store.__setitem__(("qkv", l), o)))
            hooks.append(block.attn.attn_drop.register_forward_hook(
                lambda m, i, o, l=l: store.__setitem__(("a", l), o)))
        hooks.append(net.norm.register_forward_hook(lambda m, i, o: store.__setitem__("pre", i[0])))
        fused = disable_fused_attention(net, [b.attn for b in blocks])
        try:
            with torch.no_grad():
                store["logits"] = net(bundle.normalize(x))
        finally:
            for h in hooks:
                h.remove()
            restore_fused_attention(fused)
    store["image_hw"] = tuple(x.shape[-2:])
    return store


def dla_read(bundle, store, w, layers="last"):
    """B x H x W: sum over heads (and layers) of a_{cls,j} <W_o v_j, g>, g = d <w, LN(cls)> / d (pre-norm final cls),
    for head rows `w` (B x D), from a `dla_record` pass."""
    net = bundle.network
    blocks = list(net.blocks)
    chosen = range(len(blocks)) if layers == "all" else [len(blocks) - 1]
    pre = store["pre"][:, 0]  # B x D
    ln = net.norm
    mu = pre.mean(-1, keepdim=True); var = pre.var(-1, unbiased=False, keepdim=True)
    xhat = (pre - mu) / (var + ln.eps).sqrt()
    gw = w * ln.weight
    D = pre.shape[-1]
    g = (gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True)) / (var + ln.eps).sqrt()
    total = 0
    for l in chosen:
        attn = blocks[l].attn
        qkv = store[("qkv", l)]
        B, N, _ = qkv.shape
        H = attn.num_heads; hd = D // H
        v = qkv.reshape(B, N, 3, H, hd)[:, :, 2]  # B x N x H x hd
        a = store[("a", l)][:, :, 0, :]  # B x H x N (cls row)
        Wo = attn.proj.weight  # D x D (out x in)
        # projected g per head: (Wo^T g) split by head
        gp = (g @ Wo).reshape(B, H, hd)  # B x H x hd
        ls = getattr(blocks[l], "ls1", None)
        if ls is not None and hasattr(ls, "gamma"):
            gp = ((g * ls.gamma) @ Wo).reshape(B, H, hd)
        contrib = torch.einsum("bhn,bnhd,bhd->bn", a, v, gp)
        total = total + contrib
    prefix = bundle.num_prefix_tokens
    size = store["image_hw"]
    gh, gw_ = bundle.patch_grid(size)
    grid = total[:, prefix:].reshape(B, 1, gh, gw_)
    return F.interpolate(grid, size=size, mode="bilinear", align_corners=False).squeeze(1)


def dla_maps(bundle, x, targets, layers="last"):
    """(B x H x W direct logit attribution of the targets' head rows, logits) from one pass."""
    store = dla_record(bundle, x)
    return dla_read(bundle, store, bundle.network.get_classifier().weight[targets], layers), store["logits"]

def z(m):
    f = m.flatten(1); return (m - f.mean(1).view(-1,1,1)) / f.std(1).clamp_min(1e-6).view(-1,1,1)

def all_maps(bundle, ex, x, t):
    with torch.no_grad():
        enc = ex.encode(x); fused, cam = ex.trunk(enc, t); m = ex.head_output(fused, cam, enc.image_hw)
    out = {"aha": m}
    dl, _ = dla_maps(bundle, x, t, "last"); da, _ = dla_maps(bundle, x, t, "all")
    out["dla_last"] = dl; out["dla_all"] = da
    zm = z(m)
    for name, d in (("last", dl), ("all", da)):
        zd = z(d)
        for lam in (0.25, 0.5, 1.0):
            out[f"add_{name}{lam:g}"] = zm + lam * zd
        gate = zd.clamp_min(0); gate = gate / gate.flatten(1).amax(1).clamp_min(1e-6).view(-1,1,1)
        out[f"gate_{name}1"] = (zm - zm.flatten(1).amin(1).view(-1,1,1)) * gate
        out[f"sig_{name}1"] = (zm - zm.flatten(1).amin(1).view(-1,1,1)) * torch.sigmoid(zd)
    return out

def main():
    torch.set_num_threads(1)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    data, out_file = sys.argv[2], sys.argv[3]
    bundle = load_model("bloodmnist-vit")
    net = bundle.network
    images, _ = load_eval_images(bundle, data, n, split="val")
    ex = load_explainer(bundle, explainer_stem("bloodmnist-vit")).eval()
    with torch.no_grad():
        targets = bundle(images).argmax(1)
    # re-initialised head copy
    rb = copy.copy(bundle); rb.network = copy.deepcopy(net)
    gen = torch.Generator().manual_seed(0)
    head = rb.network.get_classifier()
    reinitialise("head", head, gen)
    ex_r = load_explainer(rb, explainer_stem("bloodmnist-vit")).eval()
    rows = {}; rhos = {}
    for s in range(0, n, 16):
        x = images[s:s+16]; t = targets[s:s+16]
        o = all_maps(bundle, ex, x, t); r = all_maps(rb, ex_r, x, t)
        for k in o:
            c = deletion_insertion(bundle, x, o[k].float(), t, steps=20, reference="mean")
            row = rows.setdefault(k, {"d": [], "i": []}); row["d"].append(np.asarray(c.deletion_auc)); row["i"].append(np.asarray(c.insertion_auc))
            rhos.setdefault(k, []).extend(spearman(o[k][i], r[k][i]) for i in range(len(x)))
    base = np.concatenate(rows["aha"]["i"]) - np.concatenate(rows["aha"]["d"])
    res = {}
    for k, row in rows.items():
        d = np.concatenate(row["d"]); i = np.concatenate(row["i"]); idl = i - d
        res[k] = dict(deletion=float(d.mean()), insertion=float(i.mean()), ins_del=float(idl.mean()), vs_aha=paired_difference(idl, base), rho=float(np.mean(rhos[k])))
        print(f"{k:14s} del {d.mean():.4f} ins {i.mean():.4f} ins-del {idl.mean():.4f} vs aha {res[k]['vs_aha']['mean']:+.4f} {np.round(res[k]['vs_aha']['ci95'],4)} rho {res[k]['rho']:.3f}", flush=True)
    json.dump(res, open(out_file, "w"), indent=1, default=float)


if __name__ == "__main__":
    main()
