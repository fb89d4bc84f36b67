"""The job panel every background job kind uses (CAMAL fine-tune, AHA training): start and cancel, a status line,
progress and a live plot."""
from __future__ import annotations

import gradio as gr


def job_controls(start_label, plot_label, *, start_id, cancel_id, status_id, progress_id, plot_id=None):
    """The controls every job form has (CAMAL fine-tune, AHA training): Start / Cancel, the job id, a status
    line, a progress number and a live plot."""
    with gr.Row():
        start = gr.Button(start_label, variant="primary", elem_id=start_id)
        cancel = gr.Button("Cancel", variant="stop", elem_id=cancel_id)
    job = gr.State(None)
    status = gr.Markdown(elem_id=status_id)
    progress = gr.Number(0, label="Progress (%)", precision=0, interactive=False, elem_id=progress_id)
    plot = gr.Plot(label=plot_label, elem_id=plot_id)
    return start, cancel, job, status, progress, plot

