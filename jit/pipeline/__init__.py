"""The warm-up pipeline: specs, plan, compile, pool, warm-up, check, shard."""
