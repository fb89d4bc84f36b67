"""Saliency Lab's service layer: what the Gradio app (app.py) calls, on top of the library `explainers`.

It imports the library and never the reverse (tests/test_layers.py checks it): `services` (the shared models,
explanation cache, review store, jobs and SAM), `errors` (which errors carry a message for the user),
`review_store`, `jobs` + `hf_jobs` (background fine-tunes, locally or on Hugging Face Jobs), `menus`,
`figures` (plotly specs), `pictures`, and one module per tab: `explain`, `browse`, `masks`, `finetune`,
`review`, `learn`.
"""
