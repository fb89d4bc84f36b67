"""Training AHA explainers (methods.md section 2), in parts as `segmentation/` and `agents/` are built:

- `loop`: `train_aha`, set-up, resume, the training step, stops (DDP through torchrun).
- `data`: training and held-out images, augmentation, mosaics, the targets of a step.
- `validation`: the fixed validation metric, the peer floor, class dependence, GridPG; the checkpoint rule.
- `export`: the card (recipe, held-out figures) and the validation plot (`plot`).
- `figures`: held-out figures of a trained explainer (`aha-figures`).
- `output_blur`: choose a trained explainer's output blur on held-out images (`aha-output-blur`).
- `job`: the app's 'aha-train' job kind.
- `cli`: the `train-aha` and `aha-figures` commands.

What an explainer is and how it runs (network, objective, store) is `explainers.aha`; this package sits above it and
above the methods it compares with.
"""
