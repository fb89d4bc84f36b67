"""Does any cheap class signal of the mosaic ViT point at the asked class's quadrant? (issue 48, bloodmnist-vit-grid)

A one pass that follows the class needs an input that differs between the classes of one mosaic in *where* it is
high. Candidates from one forward pass (and, for the gradients, one backward per class), each scored by GridPG (the
positive share inside the class's quadrant) and the top-quarter share (rank only) on the validation mosaics that the
AHA rules use (seed 0, val split):
- the final patch tokens read through the head (`token_logits` as the explainer's class input reads them), raw, as a
  log-softmax over the classes, and centred over the classes;
- the last block's attention from the class token, each patch's value read through the head (a direct logit
  attribution of the last attention layer; the final norm taken as its scale only);
- at every block's output: gradient x activation summed over channels, the gradient's norm, and Grad-CAM (the
  class's gradient averaged over the tokens, times the tokens, positive part).
Chance is 0.25.

    PYTHONPATH=. python bench/studies/grid_class_signals.py --data DATA/bloodmnist/64 \
        --out bench/results/grid-class-signals-val64.json
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from explainers.aha_training.validation import validation_mosaics
from explainers.gridpg import quadrant_share, top_quarter_share
from explainers.models import load_model


def upsampled(per_token: torch.Tensor, size) -> torch.Tensor:
    """(B x N) token scores on a square grid -> B x H x W maps."""
    side = int(round(per_token.shape[1] ** 0.5))
    return F.interpolate(per_token.reshape(-1, 1, side, side), size=size, mode="bilinear", align_corners=False)[:, 0]


def last_block_logit_attribution(net, x: torch.Tensor) -> torch.Tensor:
    """B x N x C: each patch's contribution to the class token through the last block's attention, read by the head."""
    block = net.blocks[-1]
    y = block.norm1(x)
    b, t, d = y.shape
    heads = block.attn.num_heads
    qkv = block.attn.qkv(y).reshape(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    q, k, v = block.attn.q_norm(qkv[0]), block.attn.k_norm(qkv[1]), qkv[2]
    attention = ((q * (d // heads) ** -0.5) @ k.transpose(-2, -1)).softmax(-1)[:, :, 0, 1:]  # B x heads x N
    weight = block.attn.proj.weight.view(d, heads, d // heads)
    contribution = torch.einsum("bhn,bhnk,ehk->bne", attention, v[:, :, 1:], weight)
    scale = block(x)[:, 0].std(-1, keepdim=True).unsqueeze(1)  # the final norm's division, as a scale only
    centred = contribution - contribution.mean(-1, keepdim=True)
    return (centred * net.norm.weight) @ net.head.weight.T / scale


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bloodmnist-vit-grid")
    parser.add_argument("--data", required=True)
    parser.add_argument("--mosaics", type=int, default=64)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    bundle = load_model(args.model)
    net = bundle.network.eval()
    mosaics, classes = validation_mosaics(bundle, args.data, args.mosaics)
    m, size = len(mosaics), mosaics.shape[-2:]
    quadrants = torch.arange(4).repeat(m)
    rows = {}

    def score(name, maps):
        maps = maps.detach()
        rows[name] = {"gridpg": float(quadrant_share(maps, quadrants).mean()),
                      "top_quarter": float(top_quarter_share(maps, quadrants).mean())}
        print(f"{name:40s} GridPG {rows[name]['gridpg']:.3f}  top quarter {rows[name]['top_quarter']:.3f}", flush=True)

    def per_class(tokens_by_class):  # B x N x C -> 4B maps, each mosaic's four classes in quadrant order
        picked = torch.stack([tokens_by_class[i][:, classes[i]] for i in range(m)])  # M x N x 4
        return upsampled(picked.permute(0, 2, 1).reshape(m * 4, -1), size)

    outputs, last_input = {}, {}
    hooks = [block.register_forward_hook(lambda _m, _a, out, i=i: outputs.__setitem__(i, out))
             for i, block in enumerate(net.blocks)]
    hooks.append(net.blocks[-1].register_forward_pre_hook(lambda _m, a: last_input.__setitem__("x", a[0])))
    logits = bundle(mosaics)
    for hook in hooks:
        hook.remove()
    with torch.no_grad():
        token_logits = net.norm(outputs[len(net.blocks) - 1])[:, 1:] @ net.head.weight.T
        score("patch tokens through the head", per_class(token_logits))
        score("... log-softmax over the classes", per_class(token_logits.log_softmax(-1)))
        score("... centred over the classes", per_class(token_logits - token_logits.mean(-1, keepdim=True)))
        attribution = last_block_logit_attribution(net, last_input["x"])
        score("last block's attention through the head", per_class(attribution))
    for i in sorted(outputs):
        signals = {"gradient x activation": [], "gradient norm": [], "Grad-CAM": []}
        for quadrant in range(4):
            grad, = torch.autograd.grad(logits.gather(1, classes[:, quadrant:quadrant + 1]).sum(), outputs[i],
                                        retain_graph=True)
            tokens, grad = outputs[i][:, 1:].detach(), grad[:, 1:]
            signals["gradient x activation"].append((grad * tokens).sum(-1))
            signals["gradient norm"].append(grad.norm(dim=-1))
            signals["Grad-CAM"].append((grad.mean(1, keepdim=True) * tokens).sum(-1).clamp_min(0))
        for name, values in signals.items():
            score(f"block {i}: {name}", upsampled(torch.stack(values, 1).reshape(m * 4, -1), size))
    report = {"model": args.model, "mosaics": m, "split": "val", "seed": 0, "chance": 0.25, "signals": rows,
              "command": f"python bench/studies/grid_class_signals.py --data {args.data} --out {args.out}"}
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
