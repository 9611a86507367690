"""astrai-plugin-ppo: hook implementations (none yet; see the distribution summary)."""
