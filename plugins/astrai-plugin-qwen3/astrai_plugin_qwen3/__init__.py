"""astrai-plugin-qwen3: hook implementations (none yet; see the distribution summary)."""
