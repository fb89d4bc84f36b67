"""How much better a distillation teacher file is than the shipped one-pass explainer on the teacher's own images
(issue #16): hard deletion / insertion (the engine, K=20, mean reference, top-1 targets) of both, with the paired
bootstrap 95% interval of teacher - one pass. A small gap means distillation has little to learn; a large gap with
no gain on validation means the student does not generalise from these images.

    python bench/studies/aha_teacher_gap.py efficientnet-lite0 ../shared/data/imagenet-train TEACHER.safetensors 40 [OUT.json]
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file

from explainers.aha.store import load_explainer
from explainers.aha_training.data import load_eval_images
from explainers.metrics import deletion_insertion
from explainers.models import load_model
from explainers.statistics import paired_difference

torch.set_num_threads(int(os.environ.get("THREADS", "2")))
model, data, teacher_file, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
bundle = load_model(model)
explainer = load_explainer(bundle).eval()
teacher = load_file(teacher_file)
indices = teacher["indices"].tolist()[:limit]
images, _ = load_eval_images(bundle, data, None, split="train", indices=indices)
with torch.no_grad():
    targets = bundle(images).argmax(1)
    _, one_pass, _ = explainer.predict_and_explain(images, targets)
curves = {"one_pass": deletion_insertion(bundle, images, one_pass, targets),
          "teacher": deletion_insertion(bundle, images, teacher["maps"][:len(indices)].float(), targets)}
result = {"images": indices, "teacher_file": os.path.basename(teacher_file)}
for name, c in curves.items():
    result[name] = {"deletion_auc": float(c.deletion_auc.mean()), "insertion_auc": float(c.insertion_auc.mean()),
                    "ins_minus_del": float(c.ins_minus_del.mean())}
result["teacher_minus_one_pass"] = {
    metric: paired_difference(getattr(curves["teacher"], attr), getattr(curves["one_pass"], attr))
    for metric, attr in (("deletion", "deletion_auc"), ("insertion", "insertion_auc"),
                         ("ins_minus_del", "ins_minus_del"))}
text = json.dumps(result, indent=1, default=float)
print(text)
if len(sys.argv) > 5:
    with open(sys.argv[5], "w") as f:
        f.write(text)
