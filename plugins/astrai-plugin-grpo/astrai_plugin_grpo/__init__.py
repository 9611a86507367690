"""astrai-plugin-grpo: hook implementations (none yet; see the distribution summary)."""
