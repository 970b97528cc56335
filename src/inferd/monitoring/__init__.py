"""Model monitoring: sampled capture, ground-truth feedback and online accuracy; drift."""
