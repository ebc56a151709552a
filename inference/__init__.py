"""Inference layer: model loading, paged KV memory, batched handlers, the ZeroMQ server.

The only package of oven that imports torch.
"""
