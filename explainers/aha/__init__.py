"""AHA, Amortized Hybrid Attribution (methods.md section 2): learn to rank pixels for deletion/insertion.

- `sort`: Gumbel-Sinkhorn soft permutations, soft top-k masks.
- `objective`: the soft deletion/insertion loss, peak penalty, references, grid augmentation, tau schedule.
- `network`: `AHAExplainer`, a light DPT-style decoder on the frozen classifier's own features.
- `refine`: test-time refinement of the output head (thread-safe).
- `store`: trained explainers in `weights/aha-<model>.safetensors` + `.json`, cached per model.

Training them is `explainers.aha_training` (above this package and the methods it compares with).
"""
from .network import AHAExplainer, Encoded
from .objective import aha_loss, soft_curves
from .refine import refine_maps
from .sort import gumbel_sinkhorn, soft_topk_masks
from .store import ExplainerUnavailable, get_explainer, load_explainer, register_explainer, save_explainer

__all__ = ["AHAExplainer", "Encoded", "aha_loss", "soft_curves", "refine_maps", "gumbel_sinkhorn",
           "soft_topk_masks", "ExplainerUnavailable", "get_explainer", "load_explainer", "register_explainer",
           "save_explainer"]
