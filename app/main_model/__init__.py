"""The main-model service and the comparison baselines served like it."""
