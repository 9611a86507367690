"""The training engine: the loop, optimizers, checkpoints and the strategy base class."""
