"""The look of the app: theme, style sheet and the title text."""
from __future__ import annotations

import gradio as gr

THEME = gr.themes.Soft(
    primary_hue="teal", secondary_hue="blue", neutral_hue="slate",
    font=["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica Neue", "Arial", "sans-serif"],
    font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"],
).set(block_title_text_weight="600", button_large_radius="10px")

CSS = """
#app-title h1 { margin-bottom: 0; }
#app-title p { margin-top: 4px; color: var(--body-text-color-subdued); }
.help { color: var(--body-text-color-subdued); font-size: 0.92em; }
.note { background: var(--background-fill-secondary); border-left: 4px solid var(--color-accent);
        padding: 6px 12px; border-radius: 6px; }
.verdict-row button { min-width: 120px; }
.warning-note { background: #fff4e5; color: #5f3b00; border-left: 4px solid #e69f00; padding: 6px 12px;
                border-radius: 6px; }
footer { display: none !important; }
/* a slider's track may shrink with its column (Gradio's 112 px floor pushed the maximum past the page's edge when
   four option sliders share a row, e.g. occlusion's window at 1280 px) */
input[type=range] { min-width: 0 !important; }
.slider_input_container { min-width: 0; }
@media (max-width: 640px) {  /* a phone: the plot's toolbar below the block's label, not over it */
  /* (a margin, not a padding: plotly sizes a responsive plot from its div's height, padding included, then draws
     the plot at 100% of that div, which then collapsed to the padding and hid the curves under the score table) */
  .block:has(> .block-label) [data-testid=plotly], .block:has([data-testid=block-label]) [data-testid=plotly] {
    margin-top: 36px; }
}
/* the page's side margins: 32 px from a 640 px wide window up, down to 12 px on a phone (40 px more of the 390 for
   every figure and table). Not in an @media block: Gradio puts its own prefix (.contain, inside .app) before every
   selector in one, and keeps a top-level rule as written too */
.gradio-container > .app { padding-left: clamp(var(--size-3), calc(10vw - 32px), var(--size-8)) !important;
                           padding-right: clamp(var(--size-3), calc(10vw - 32px), var(--size-8)) !important; }
#input-image img, #sam-view img { width: 100%; height: 100%; object-fit: contain; }
#input-image img { image-rendering: auto; }
/* Explain with up to 6 methods: every map and every number visible (no inner scroll, wrapped captions) */
#overlays .grid-wrap, #sanity-gallery .grid-wrap, #grid-gallery .grid-wrap, #before-after .grid-wrap, [id$="-step-pictures"] .grid-wrap {
  max-height: none !important; min-height: 0 !important; height: auto !important; overflow: visible !important; }
/* ...and the sanity check's maps, whose captions (method · stage) differ only at their end, the grid pointing
   game's (method · class · score; two columns on a phone), and the curve step
   viewer's two pictures ("Deletion, step 5/20: 25% of the pixels..."): whole captions under the pictures */
#overlays .thumbnail-item, #sanity-gallery .thumbnail-item, #grid-gallery .thumbnail-item, [id$="-step-pictures"] .thumbnail-item {
  aspect-ratio: auto !important; height: auto !important; overflow: visible !important; }
#overlays .thumbnail-lg > img, #sanity-gallery .thumbnail-lg > img, #grid-gallery .thumbnail-lg > img,
[id$="-step-pictures"] .thumbnail-lg > img { height: auto !important; aspect-ratio: 1 / 1; }
#overlays .caption-label, #sanity-gallery .caption-label, #grid-gallery .caption-label, [id$="-step-pictures"] .caption-label { position: static !important; white-space: normal !important; max-width: 100% !important;
                           overflow: visible !important; text-overflow: clip !important; font-size: 12px;
                           line-height: 1.3; border: none !important; opacity: 1 !important; }
@media (max-width: 640px) { #overlays .grid-container, #grid-gallery .grid-container {
  grid-template-columns: repeat(2, minmax(0, 1fr)) !important; } }
#grid-gallery .grid-wrap { padding-top: 36px; }  /* clear of the block's label */
@media (max-width: 640px) { #grid-gallery .grid-wrap { padding-top: 58px; } }  /* a label on two lines */
/* each row of maps as tall as its own captions (not all as tall as the tallest: a blank band between rows) */
#overlays .grid-container, #sanity-gallery .grid-container, #grid-gallery .grid-container, [id$="-step-pictures"] .grid-container {
  grid-auto-rows: auto !important; }
/* the segmentation view's maps: whole (the smear's shape, not a square crop), each caption (its IoU and PA) whole */
#seg-maps .grid-container { grid-template-columns: repeat(2, minmax(0, 1fr)) !important; }  /* a lone map too */
#seg-maps .grid-wrap { max-height: none !important; min-height: 0 !important; height: auto !important;
                       overflow: visible !important; padding-top: 36px; }  /* clear of the block's label */
@media (max-width: 640px) { #seg-maps .grid-wrap { padding-top: 58px; } }  /* a label on two lines */
#seg-maps .thumbnail-item, #cue-gallery .thumbnail-item { aspect-ratio: auto !important; height: auto !important; overflow: visible !important; }
#seg-maps .thumbnail-lg > img, #cue-gallery .thumbnail-lg > img { height: auto !important; object-fit: contain !important; }
#seg-maps .caption-label, #cue-gallery .caption-label { position: static !important; white-space: normal !important; max-width: 100% !important;
                           overflow: visible !important; text-overflow: clip !important; font-size: 12px;
                           line-height: 1.3; border: none !important; opacity: 1 !important; }
/* the segmentation view's score table (up to eight columns): a word or a number is never broken over lines; on a
   phone small type and padding, so that the eight columns fit the width */
#seg-scores table, #grid-info table { table-layout: auto; width: 100%; }
#seg-scores td, #seg-scores th, #grid-info td, #grid-info th { word-break: normal !important;
                                   overflow-wrap: normal !important; hyphens: none; }
#seg-scores td:not(:first-child), #grid-info td:not(:first-child) { white-space: nowrap; }
@media (max-width: 640px) {
  #seg-scores td, #seg-scores th, #grid-info td, #grid-info th { font-size: 10.5px !important;
                                   padding: 3px 1px !important; line-height: 1.25; }
  /* ten columns with the ground truth's two (the grid game's six): never cut at the screen's edge, scrolled
     sideways if need be */
  #seg-scores table, #grid-info table { display: block; overflow-x: auto; max-width: 100%; }
  #seg-scores p { font-size: 12px; }
  /* the step viewer's plot has no label: its toolbar below the figure's title, not over it */
  [id$="-step-plot"] [data-testid=plotly] { margin-top: 36px; }
}
#aucs table { table-layout: auto; }
#aucs td, #aucs th { white-space: normal !important; font-size: 13px; }
/* (no column hidden on a phone: Gradio's virtual table then draws an empty body, one tall blank row)
   On a phone the six columns fit the width: Gradio sizes each column from its header and one sizing row
   (.sizing-body) laid out as an auto table, then gives the body cells those widths. So: small type and padding,
   the number columns as narrow as their numbers and header words, the method column wide enough for its longest
   word ("(amortized)": the sizing row holds one row only), the options wrapped anywhere in the width left. */
@media (max-width: 640px) {
  #aucs .sizing-body td { padding: 0 !important; }
  #aucs th .cell-wrap, #aucs td .cell-wrap, #aucs .body-cell .cell-wrap { padding: 4px 3px !important; }
  #aucs th, #aucs td, #aucs th span, #aucs .body-cell span, #aucs td .cell-wrap { font-size: 11px !important; }
  #aucs th span, #aucs td:nth-child(-n+2) .cell-wrap, #aucs .body-cell:nth-child(-n+2) span {
    font-family: var(--font) !important; }
  #aucs th span, #aucs td:nth-child(1) .cell-wrap, #aucs .body-cell:nth-child(1) span {
    word-break: normal !important; overflow-wrap: normal !important; }
  #aucs th:nth-child(1) { min-width: 72px; }
  #aucs th:nth-child(n+3), #aucs .sizing-body td:nth-child(n+3) { width: 1px; }
  #aucs td:nth-child(2) .cell-wrap, #aucs .body-cell:nth-child(2) span { overflow-wrap: anywhere; }
}
/* the fine-tune's before / after table on a phone: the three columns in the width, the row names wrapped */
@media (max-width: 640px) {
  #finetune-compare th span, #finetune-compare td .cell-wrap, #finetune-compare .body-cell span {
    font-size: 11px !important; font-family: var(--font) !important; }
  #finetune-compare th .cell-wrap, #finetune-compare td .cell-wrap { padding: 4px 3px !important; }
  #finetune-compare th:nth-child(n+2), #finetune-compare .sizing-body td:nth-child(n+2) { width: 1px; }
}
.section-title p { margin: 0; font-size: 1.05em; }
/* example thumbnails: the name under the picture, not over it */
.example-gallery .thumbnail-item { aspect-ratio: auto !important; height: auto !important; overflow: visible !important; }
.example-gallery .thumbnail-item > img { height: auto !important; aspect-ratio: 1 / 1; }
.example-gallery .caption-label { position: static !important; font-size: 11px; max-width: 100% !important;
                                  white-space: nowrap; overflow: hidden; text-overflow: ellipsis;
                                  border: none !important; opacity: 1 !important; line-height: 1.25; }
/* as many example columns as fit (a fixed 4 ran past the right edge of a phone) */
.example-gallery .grid-container { grid-template-columns: repeat(auto-fill, minmax(84px, 1fr)) !important; }
.example-gallery .grid-wrap { max-height: none !important; min-height: 0 !important; height: auto !important;
                              overflow: visible !important; padding-top: 36px; }  /* clear of the block's label */
@media (max-width: 640px) { .example-gallery .grid-wrap { padding-top: 58px; } }  /* a label on two lines */
/* the data-set browser and the review gallery: as many columns as fit (no clipped column), whole labels */
#browse-gallery .grid-container, #review-gallery .grid-container {
  grid-template-columns: repeat(auto-fill, minmax(84px, 1fr)) !important; }
#browse-gallery .grid-wrap, #review-gallery .grid-wrap { padding-top: 36px; }  /* clear of the block's label */
#browse-gallery .thumbnail-item, #review-gallery .thumbnail-item {
  aspect-ratio: auto !important; height: auto !important; overflow: visible !important; }
#browse-gallery .thumbnail-item > img, #review-gallery .thumbnail-item > img { height: auto !important;
  aspect-ratio: 1 / 1; }
#browse-gallery .caption-label, #review-gallery .caption-label { position: static !important;
  white-space: normal !important; max-width: 100% !important; overflow: visible !important;
  text-overflow: clip !important; font-size: 11px; line-height: 1.25; border: none !important;
  opacity: 1 !important; }
.colour-bar { margin: 2px 0 6px; }
.colour-bar-strip { height: 12px; border-radius: 4px; border: 1px solid var(--border-color-primary); }
.colour-bar-labels { display: flex; justify-content: space-between; font-size: 12px;
                     color: var(--body-text-color-subdued); }
"""

INTRO = """# Saliency Lab
Which pixels made the classifier decide, and can we trust that answer? Pick an image and a model, compare
explanation methods side by side, and check them with deletion/insertion curves.
"""


