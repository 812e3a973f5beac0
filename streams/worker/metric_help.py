"""What each series of a worker's ``/metrics`` means (its ``# HELP`` line)."""

DESCRIPTIONS: dict[str, str] = {
    "messages_total": "input messages taken from Kafka",
    "entries_total": "events of accepted input messages sent to the ledger",
    "events_total": "ledger entries counted into Redis: one per event, one per quantity "
                    "(tokens, steps, samples) of a progress event",
    "rejected_total": "input messages sent to the dead-letter topic, by reason",
    "input_messages_expired_total": "input messages removed by their topic's retention "
                                    "before intake priced them, by topic and partition",
    "batches_total": "Redis batch writes applied",
    "events_duplicate_total": "ledger entries ignored because their event was counted",
    "ledger_records_replayed_total": "ledger records skipped as already applied",
    "ledger_records_unreadable_total": "ledger records that were not ledger records",
    "ledger_records_expired_total": "ledger records removed by the ledger's retention "
                                    "before Redis counted them, by partition",
    "redis_apply_seconds": "latency of one batch write to Redis",
    "redis_evicting_nodes": "Redis servers that may evict costline's keys (a "
                            "maxmemory-policy other than noeviction under a maxmemory)",
    "evaluations_total": "rule evaluations run",
    "alert_changes_total": "alert state changes published",
    "notifier_deliveries_total": "alert changes handled by each notifier, by outcome "
                                 "(docs/NOTIFY.md)",
    "evaluation_seconds": "latency of one evaluation (every rule on the tick; between "
                          "ticks, the rules new data can change)",
    "input_lag": "committed input messages not yet priced into the ledger",
    "consumer_lag": "ledger records not yet applied to Redis",
    "tagsets_known": "tag sets the worker knows Redis holds, so does not send again "
                     "(one budget over its partitions)",
    "unwritten_events": "events folded and not yet written to Redis, over the "
                        "worker's partitions (at most COSTLINE_UNWRITTEN_EVENTS and one "
                        "window)",
}
