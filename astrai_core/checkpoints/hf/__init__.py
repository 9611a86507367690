"""Hugging Face checkpoint import/export (the ``model_importer`` kind).

The contract is in :mod:`astrai_core.checkpoints.hf.base`;
:mod:`astrai_core.checkpoints.hf.select` chooses an importer. Importing this package does
not import torch.
"""
