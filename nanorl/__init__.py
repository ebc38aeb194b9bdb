"""nanorl plumbing (config, DDP, logging, checkpoints, evaluation, the training loop) and the
features that are off by default, each in its own file, opened only when its flag or row asks."""
