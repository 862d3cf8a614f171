"""`make field`: the four field failures under a pod's real limits, naive against inferop, in one run."""
