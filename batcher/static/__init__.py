"""Static batching, our own: rounds of up to BATCH_SIZE prompts, one generate() each."""
