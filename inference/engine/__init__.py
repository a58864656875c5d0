"""The torch engine: model forward, KV cache, scheduler, sampler. No Django import below here."""
