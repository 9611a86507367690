"""astrai-plugin-vllm: hook implementations (none yet; see the distribution summary)."""
