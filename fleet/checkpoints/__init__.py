"""`fleet checkpoints`: what a training run saved on every node, and consolidating its shards."""
