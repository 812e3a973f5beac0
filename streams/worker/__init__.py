"""The worker: the Faust app, its agents, the aggregation, evaluation, notification and
reclamation."""
