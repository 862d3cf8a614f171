"""`make bench`: speed and memory figures against their targets, as ratios measured in one run."""
