"""Segmentation models (SegFormer), BCCD masks, region targets, methods and evaluation."""
