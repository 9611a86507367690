"""Device backends: every device question goes through one of these (see base.py)."""
