"""Hugging Face checkpoint import/export (the ``model_importer`` kind).

The contract is in :mod:`astrai_core.importers.base`; :mod:`astrai_core.importers.select`
chooses an importer. Importing this package does not import torch.
"""
