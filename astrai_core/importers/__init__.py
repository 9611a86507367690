"""Parity tools for model importers (:mod:`astrai_core.importers.parity`).

The importers themselves are in :mod:`astrai_core.checkpoints.hf`.
"""
