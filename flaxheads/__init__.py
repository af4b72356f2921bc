"""flaxheads: transformer sequence classifiers in Flax NNX."""
