"""astrai-plugin-dpo: hook implementations (none yet; see the distribution summary)."""
