"""astrai-plugin-npu: hook implementations (none yet; see the distribution summary)."""
