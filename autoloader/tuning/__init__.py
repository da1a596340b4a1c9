"""The two tuning modes: ``trials`` before training, ``online`` in the training loop (over ``slices`` of an epoch)."""
