"""astrai-core's own strategies: `seq` (pretraining) and `sft` (supervised fine-tuning)."""
