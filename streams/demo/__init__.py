"""The demo: a training cluster's scenario, its data, and the command that plays it."""
