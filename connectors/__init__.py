"""Everything that talks to the outside world: Kafka, Redis, Slack, billing files, reclaimers."""
