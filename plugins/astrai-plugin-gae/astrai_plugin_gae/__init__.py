"""astrai-plugin-gae: hook implementations (none yet; see the distribution summary)."""
