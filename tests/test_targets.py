"""The target protocol (explainers.targets): what an explanation explains, for any model kind.

The class-target maps and curves are held to the ones the methods gave before the protocol existed
(`tests/data/class_target_maps.safetensors`, written by `python tests/test_targets.py` at that commit): the
protocol changed how a method reads its score, not what it computes."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import DATA_DIR, tiny_cnn  # noqa: E402

GOLDEN = os.path.join(DATA_DIR, "class_target_maps.safetensors")
# (label, method name, options): every method that takes any target, on class indices
CLASS_CASES = (("occlusion", "occlusion", {"window_fraction": 0.25}),
               ("occlusion-probability", "occlusion", {"window_fraction": 0.25, "score": "probability"}),
               ("rise", "rise", {"n_masks": 40, "batch_size": 16}),
               ("random", "random", {}),
               ("gradcam", "gradcam", {}),
               ("aha-per-image", "aha", {"mode": "per-image", "per_image_steps": 2}))


def golden_inputs():
    """Three 32 px images (the first twice, for two classes: one image explained for several classes) on a tiny
    CNN with four classes."""
    generator = torch.Generator().manual_seed(3)
    images = torch.rand(2, 3, 32, 32, generator=generator)
    return tiny_cnn(seed=1), images[[0, 0, 1]], torch.tensor([0, 2, 1])


def class_target_results(targets=None) -> dict:
    """Each case's maps, and the deletion/insertion curves of the Grad-CAM maps (`targets`: as the methods get
    them; None: the class indices)."""
    from explainers.methods import get_method
    from explainers.metrics import deletion_insertion

    bundle, images, classes = golden_inputs()
    targets = classes if targets is None else targets
    results = {}
    for label, name, options in CLASS_CASES:
        torch.manual_seed(0)
        results[label] = get_method(name, **options).attribute(bundle, images, targets).detach().float()
    curves = deletion_insertion(bundle, images, results["gradcam"], targets, steps=8)
    results["curves"] = torch.stack([torch.as_tensor(curves.deletion), torch.as_tensor(curves.insertion)]).float()
    return results


if __name__ == "__main__":
    from safetensors.torch import save_file

    save_file({key: value.contiguous() for key, value in class_target_results().items()}, GOLDEN)
    print("wrote", GOLDEN)
