"""Experiment trackers: `trainer.report_to` sends the run's config and metrics to
TensorBoard, Weights & Biases, MLflow, Trackio or any tracker a plugin registers.

``metrics.jsonl`` stays the run's record; trackers get the same numbers, on rank 0.
Each built-in tracker imports its backend only when a run starts it, and the run plan
checks beforehand that the backend is installed (``pip install 'astrai-core[NAME]'``).
"""
